# ruff: noqa: ASYNC110, ASYNC240 - test plugins poll small local files on purpose
"""Misbehaving triggers and producers for ``tests/e2e/test_bad_inputs_runtime.py``.

The test copies this file into the engine's ``[core] plugins_folder``, so the classpaths are
``runtime_triggers.<Class>``. Each watcher trigger waits for its *go file*
(``<directory>/<case>.go``), deletes it, then misbehaves once; the test decides when. The
``DirBroker*`` triggers share an ack-mode upstream: a directory standing in for a broker
(``msgs/*.msg`` are the messages, an advance moves them to ``acked/`` or ``dead/``, and files
named ``open.fail`` / ``advance.fail`` / ``stream.end`` make the producer misbehave).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from shared_stream.producer import SharedStreamProducer
from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import UpstreamUnavailable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Sequence

    from shared_stream.producer import AdvanceItem

POLL_S = 0.05
HUGE_PAYLOAD_BYTES = 20 * 1024 * 1024
BLOCK_S = 1.0


def take(path: Path) -> bool:
    """Delete ``path``; True when it existed (a marker consumed once)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


async def wait_for_file(path: Path) -> None:
    while not take(path):
        await anyio.sleep(POLL_S)


class _Case(BaseEventTrigger):
    """A watcher trigger driven by go files; ``case`` names it in payloads and go files."""

    def __init__(self, *, directory: str, case: str) -> None:
        super().__init__()
        self.directory = directory
        self.case = case

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"directory": self.directory, "case": self.case}

    async def go(self) -> None:
        await wait_for_file(Path(self.directory) / f"{self.case}.go")

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            await self.go()
            async for event in self.misbehave():
                yield event

    async def misbehave(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError
        yield  # pragma: no cover


class ControlWatcher(_Case):
    """The healthy control: one event per ``*.ctl`` file, deduplicated by file name."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        folder = Path(self.directory)
        while True:
            for path in sorted(folder.glob("*.ctl")):
                if take(path):
                    yield TriggerEvent({"control": path.name}, dedup_key=f"ctl:{path.name}")
            await anyio.sleep(POLL_S)


class ExitsWithoutEvent(_Case):
    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.go()
        return
        yield  # pragma: no cover


class YieldsNonEvent(_Case):
    async def misbehave(self) -> AsyncIterator[Any]:
        yield TriggerEvent({"case": self.case, "n": 1}, dedup_key=f"{self.case}:1")
        yield {"case": self.case, "n": 2}  # a dict, not a TriggerEvent


class ReturnsEvent(_Case):
    async def run(self) -> TriggerEvent:  # type: ignore[override]
        await self.go()
        return TriggerEvent({"case": self.case})


class BlocksLoop(_Case):
    async def misbehave(self) -> AsyncIterator[TriggerEvent]:
        time.sleep(BLOCK_S)  # noqa: ASYNC251 - the bad input under test
        yield TriggerEvent({"case": self.case, "blocked_s": BLOCK_S}, dedup_key=self.case)


class RaisesInRun(_Case):
    async def misbehave(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"case": self.case, "n": 1}, dedup_key=f"{self.case}:1")
        raise RuntimeError(f"{self.case}: the upstream answered garbage")


class NonSerializablePayload(_Case):
    async def misbehave(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"case": self.case, "n": 1}, dedup_key=f"{self.case}:1")
        yield TriggerEvent({"case": self.case, "connection": object()})


class HugePayload(_Case):
    async def misbehave(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"case": self.case, "blob": "x" * HUGE_PAYLOAD_BYTES})
        yield TriggerEvent({"case": self.case, "after": True}, dedup_key=f"{self.case}:after")


class DuplicateDedupKeys(_Case):
    async def misbehave(self) -> AsyncIterator[TriggerEvent]:
        for n in range(3):
            yield TriggerEvent({"case": self.case, "n": n}, dedup_key=f"{self.case}:same")
        yield TriggerEvent({"case": self.case, "n": 99}, dedup_key=f"{self.case}:other")


# -- deferred-task triggers -----------------------------------------------------------------


class _TaskTrigger(BaseTrigger):
    """A deferred task's trigger; ``marker`` is a file it writes from ``cleanup()``."""

    def __init__(self, *, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"marker": self.marker}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"fired": type(self).__name__})

    async def cleanup(self) -> None:
        Path(self.marker).write_text("cleaned up")


class NeverYields(_TaskTrigger):
    async def run(self) -> AsyncIterator[TriggerEvent]:
        await anyio.sleep_forever()
        yield TriggerEvent({})  # pragma: no cover


class RaisesInCleanup(_TaskTrigger):
    async def cleanup(self) -> None:
        raise RuntimeError("cleanup-boom: could not close the session")


class CleanupHangs(_TaskTrigger):
    async def cleanup(self) -> None:
        await anyio.sleep_forever()


class DeferredRaises(_TaskTrigger):
    async def run(self) -> AsyncIterator[TriggerEvent]:
        await anyio.sleep(0.1)
        raise ValueError("deferred-boom: job 42 is unknown to the remote service")
        yield TriggerEvent({})  # pragma: no cover


# -- an ack-mode upstream backed by a directory ---------------------------------------------


class DirProducer(SharedStreamProducer):
    """Yields ``msgs/*.msg`` (names); an advance moves each to ``acked/`` or ``dead/``.

    ``open.fail`` present: ``open_stream`` raises (at open, or at its next poll);
    ``stream.end``: it returns (once); ``advance.fail``: the next ``advance`` raises (once).
    """

    def __init__(self, directory: str) -> None:
        self.base = Path(directory)

    def _check_reachable(self) -> None:
        if (self.base / "open.fail").exists():
            # as a broker adapter does: an unreachable broker is UpstreamUnavailable with the
            # address (a bare ConnectionError would be a trigger's bug, with its traceback)
            raise UpstreamUnavailable(
                f"dir broker {self.base} is unreachable (open.fail is present)",
                address=str(self.base),
            )

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        seen: set[str] = set()
        while True:
            self._check_reachable()  # raises at open, or mid-stream once the broker goes away
            for path in sorted((self.base / "msgs").glob("*.msg")):
                if path.name not in seen:
                    seen.add(path.name)
                    yield path.name, path.name
            if take(self.base / "stream.end"):
                return
            await anyio.sleep(POLL_S)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if take(self.base / "advance.fail"):
            raise RuntimeError(f"dir broker {self.base}: advance refused (advance.fail)")
        for name, outcome in batch:
            target = "acked" if outcome.is_clean else "dead"
            source = self.base / "msgs" / name
            if source.exists():
                source.rename(self.base / target / name)


class DirBrokerTrigger(BaseEventTrigger):
    """A watcher on a dir broker; its filter raises on the message named ``poison``."""

    def __init__(self, *, directory: str, name: str, poison: str | None = None) -> None:
        super().__init__()
        self.directory = directory
        self.name = name
        self.poison = poison

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {"directory": self.directory, "name": self.name, "poison": self.poison}
        return classpath_of(self), kwargs

    def shared_stream_key(self) -> Hashable | None:
        return ("dirbroker", self.directory)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return DirProducer(kwargs["directory"])

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            if message == self.poison:
                raise ValueError(f"filter of {self.name}: cannot parse message {message}")
            yield TriggerEvent({"message": message, "watcher": self.name}, dedup_key=message)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError("DirBrokerTrigger only runs on a shared stream")
        yield  # pragma: no cover
