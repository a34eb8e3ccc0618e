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

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

logger = logging.getLogger(__name__)

WATCH_STEP_MS: Final = 50
RECENT_WRITES_MAX: Final = 4096


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
    """The last mtime fired per path, bounded: one event per write, not one per change kind."""

    __slots__ = ("_limit", "_mtimes")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._mtimes: dict[str, int] = {}

    def is_new(self, path: str, mtime_ns: int) -> bool:
        """Record ``(path, mtime_ns)``; False if it was the last write recorded for ``path``."""
        if self._mtimes.get(path) == mtime_ns:
            return False
        self._mtimes.pop(path, None)
        self._mtimes[path] = mtime_ns
        if len(self._mtimes) > self._limit:
            del self._mtimes[next(iter(self._mtimes))]
        return True

    def __repr__(self) -> str:
        return f"<_RecentWrites {len(self._mtimes)}/{self._limit} paths>"


def _regular_file_mtimes(paths: Iterable[str]) -> dict[str, int]:
    """``st_mtime_ns`` of each path that is (still) a regular file."""
    mtimes: dict[str, int] = {}
    for path in paths:
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(info.st_mode):
            mtimes[path] = info.st_mtime_ns
    return mtimes


class DirectoryWatchTrigger(BaseEventTrigger):
    """Fires once per file written in ``directory`` whose name matches ``pattern`` (fnmatch).

    Payload: ``{"path": ..., "change": "added" | "modified"}``; the event's ``dedup_key`` is
    the path and its mtime, so one write seen as several changes is one asset event.
    Deletions and paths already gone are skipped: a write-to-temp-then-rename shows up as
    the final name ``added``.
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
            except FileNotFoundError as exc:
                raise TriggerError(
                    f"DirectoryWatchTrigger cannot watch {self.directory!r}: it does not exist; "
                    "create the directory before the watcher starts"
                ) from exc
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
        mtimes = await anyio.to_thread.run_sync(_regular_file_mtimes, sorted(candidates))
        events: list[TriggerEvent] = []
        for path, mtime_ns in mtimes.items():
            if recent.is_new(path, mtime_ns):
                change_name = "added" if path in added else "modified"
                payload = {"path": path, "change": change_name}
                events.append(TriggerEvent(payload, dedup_key=f"{path}@{mtime_ns}"))
        return events
