"""``DirectoryWatchTrigger``: file-system notifications (inotify and friends), no polling.

``watchfiles.awatch`` waits for changes in a worker thread. That thread only notices a stop
request by checking its stop event every ``step`` milliseconds, and anyio does not deliver a
cancellation to the waiting task until the thread returns; so the stop event given here also
reports "set" once the host task's cancel scope is cancelled, and cancelling the trigger
takes at most one step instead of watchfiles' 5-second timeout.

Each watcher keeps one anyio worker thread busy while it waits: the runtime must size the
default thread limiter for the number of watchers it runs.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import stat
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import watchfiles

from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerError
from triggers.file import DirectoryPresence, file_dedup_key

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Iterable

logger = logging.getLogger(__name__)

WATCH_STEP_MS: Final = 50
RECENT_WRITES_MAX: Final = 4096
#: how often a watcher whose directory does not exist checks whether it appeared
MISSING_DIRECTORY_POLL_S: Final = 2.0


class _StopOnCancel(asyncio.Event):
    """A stop event for ``awatch`` that is also set while the waiting task is cancelled.

    ``is_set`` is polled by the watch thread; ``check_cancelled`` reads the cancel scope of
    the host task that started that thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cancelled_exc = anyio.get_cancelled_exc_class()

    def is_set(self) -> bool:
        if super().is_set():
            return True
        try:
            anyio.from_thread.check_cancelled()
        except self._cancelled_exc:
            return True
        except anyio.NoEventLoopError:  # not in an anyio worker thread: nothing to check
            return False
        return False


class _RecentWrites:
    """The last version fired per path, bounded: one event per write, not per change kind.

    A version is the file's ``file_dedup_key`` (identity, mtime, size).
    """

    __slots__ = ("_limit", "_versions")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._versions: dict[str, str] = {}

    def is_new(self, path: str, version: str) -> bool:
        """Record ``(path, version)``; False if it was the last one recorded for ``path``."""
        if self._versions.get(path) == version:
            return False
        self._versions.pop(path, None)
        self._versions[path] = version
        if len(self._versions) > self._limit:
            del self._versions[next(iter(self._versions))]
        return True

    def __repr__(self) -> str:
        return f"<_RecentWrites {len(self._versions)}/{self._limit} paths>"


def _regular_file_versions(paths: Iterable[str]) -> dict[str, str]:
    """The ``file_dedup_key`` of each path that is (still) a regular file."""
    versions: dict[str, str] = {}
    for path in paths:
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(info.st_mode):
            versions[path] = file_dedup_key(path, info)
    return versions


def _is_directory(path: str) -> bool:
    return os.path.isdir(path)


class DirectoryWatchTrigger(BaseEventTrigger):
    """Fires once per file written in ``directory`` whose name matches ``pattern`` (fnmatch).

    Payload: ``{"path": ..., "change": "added" | "modified"}``; the event's ``dedup_key`` is
    the file's identity and mtime (``file_dedup_key``), so one write seen as several changes
    is one asset event, and a file replaced within the same mtime is another.
    Deletions and paths already gone are skipped: a write-to-temp-then-rename shows up as
    the final name ``added``.

    ``debounce_ms`` (default 50): changes are yielded once none came for that long (at most
    ``debounce_ms`` after the first of a burst), so an event comes one to two debounce
    periods after the write. While idle, the watcher's thread also wakes every
    ``min(debounce_ms, 50)`` ms to check whether it was stopped: a shorter debounce buys
    latency with CPU (``bench/engine_bench.py`` measures both: 100 idle watchers use about
    six times the CPU at 5 ms as at 50 ms), which is why the default stays 50.
    """

    def __init__(
        self,
        directory: str,
        pattern: str = "*",
        *,
        recursive: bool = True,
        debounce_ms: int = 50,
    ) -> None:
        super().__init__()
        if isinstance(debounce_ms, bool) or not isinstance(debounce_ms, int) or debounce_ms < 1:
            raise ValueError(
                f"DirectoryWatchTrigger debounce_ms must be an int >= 1, got {debounce_ms!r}"
            )
        self.directory = os.fspath(directory)
        self.pattern = pattern
        self.recursive = bool(recursive)
        self.debounce_ms = debounce_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            classpath_of(self),
            {
                "directory": self.directory,
                "pattern": self.pattern,
                "recursive": self.recursive,
                "debounce_ms": self.debounce_ms,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        recent = _RecentWrites(RECENT_WRITES_MAX)
        presence = DirectoryPresence(self.directory, "DirectoryWatchTrigger")
        while True:
            exists = await anyio.to_thread.run_sync(_is_directory, self.directory)
            presence.saw(exists, every_s=MISSING_DIRECTORY_POLL_S)
            if not exists:  # said once; it may be created later
                await anyio.sleep(MISSING_DIRECTORY_POLL_S)
                continue
            async with aclosing(self._watch(recent)) as events:
                async for event in events:
                    yield event

    async def _watch(self, recent: _RecentWrites) -> AsyncGenerator[TriggerEvent, None]:
        """Events of the directory while it exists; returns when it went away."""
        changes_stream = watchfiles.awatch(
            self.directory,
            debounce=self.debounce_ms,
            step=min(WATCH_STEP_MS, self.debounce_ms),
            stop_event=_StopOnCancel(),
            recursive=self.recursive,
        )
        logger.debug(
            "Watching %s for %s",
            self.directory,
            self.pattern,
            extra={"action": "watch_start", "trigger_id": self.trigger_id},
        )
        async with aclosing(changes_stream):
            try:
                async for changes in changes_stream:
                    for event in await self._events_for(changes, recent):
                        yield event
            except FileNotFoundError:
                return  # removed (or not there yet when awatch started): wait for it again
        # awatch only ends when its stop event is set, i.e. when this task is cancelled:
        # let the pending cancellation surface instead of returning without an event.
        await anyio.lowlevel.checkpoint()
        raise TriggerError(f"DirectoryWatchTrigger on {self.directory!r} stopped unexpectedly")

    async def _events_for(
        self, changes: set[tuple[watchfiles.Change, str]], recent: _RecentWrites
    ) -> list[TriggerEvent]:
        added: set[str] = set()
        candidates: set[str] = set()
        for change, path in changes:
            if change is watchfiles.Change.deleted:
                continue
            if fnmatch.fnmatch(os.path.basename(path), self.pattern):
                candidates.add(path)
                if change is watchfiles.Change.added:
                    added.add(path)
        if not candidates:
            return []
        versions = await anyio.to_thread.run_sync(_regular_file_versions, sorted(candidates))
        events: list[TriggerEvent] = []
        for path, version in versions.items():
            if recent.is_new(path, version):
                change_name = "added" if path in added else "modified"
                payload = {"path": path, "change": change_name}
                events.append(TriggerEvent(payload, dedup_key=version))
        return events
