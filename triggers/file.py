"""File-system triggers that poll: a path or glob appears, a flag file appears (and is eaten).

Every poll runs in a worker thread (``anyio.to_thread.run_sync``): a network file system can
block for seconds, and the loop runs thousands of other triggers. Taking a flag file that a
poll has just found (its stat and unlink) runs on the loop, with no await between it and the
event it fires: a trigger stopped while a thread deleted the file would otherwise lose the
event (the thread finishes its unlink, the cancelled task fires nothing).

anyio is imported where a trigger polls (its ``run``), not at import: DAG files that declare
these triggers are imported by every task process and every parse, which poll nothing.

``DirectoryFileDeleteTrigger`` shares one directory listing per cadence among all siblings
watching the same directory (``shared_stream_key``); ``LISTING_STATS`` counts the listings.
"""

from __future__ import annotations

import bisect
import glob
import logging
import os
import stat
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Hashable

logger = logging.getLogger(__name__)

DEFAULT_POKE_INTERVAL_S: Final = 5.0


def _check_poke_interval(owner: str, poke_interval: float) -> float:
    if isinstance(poke_interval, bool) or not isinstance(poke_interval, int | float):
        raise TypeError(f"{owner} poke_interval must be a number of seconds, got {poke_interval!r}")
    if not poke_interval > 0:
        raise ValueError(f"{owner} poke_interval must be > 0 seconds, got {poke_interval!r}")
    return poke_interval


def _glob_files(pattern: str, recursive: bool) -> list[str]:
    """Regular files matching ``pattern`` (a plain path matches itself), sorted."""
    return sorted(path for path in glob.glob(pattern, recursive=recursive) if os.path.isfile(path))


def file_dedup_key(path: str, info: os.stat_result) -> str:
    """The dedup key of one version of a file: its identity, mtime and size, then its path.

    ``file:<device>:<inode>:<mtime_ns>:<size>:<path>``. Seeing the same file again (a
    re-listing, a notification repeated, a takeover by another triggerer) gives the same
    key, so one asset event; a file replaced within the file system's mtime granularity (a
    new inode, or another size) gives another key. A file deleted and written again with the
    same size, within the same mtime tick, and given back the freed inode number cannot be
    told apart by ``stat``. The path comes last: keys are cut to 512 characters.
    """
    return f"file:{info.st_dev}:{info.st_ino}:{info.st_mtime_ns}:{info.st_size}:{path}"


def _take_file(path: str) -> os.stat_result | None:
    """Unlink ``path`` if it is a regular file; its stat, or None if it was not there.

    A file that vanishes between the check and the unlink (a sibling, another triggerer or
    the user removed it) is not an error: the caller fires nothing for it.
    """
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None
        os.unlink(path)
    except FileNotFoundError:
        return None
    return info


def _watched_file_state(path: str) -> tuple[bool, bool]:
    """Whether a regular file is at ``path``, and whether the directory of ``path`` exists."""
    try:
        if stat.S_ISREG(os.stat(path).st_mode):
            return True, True
    except FileNotFoundError:
        pass
    return False, os.path.isdir(os.path.dirname(path) or os.curdir)


class DirectoryPresence:
    """Says once that a watched directory does not exist, and once when it appears.

    A watcher on a missing directory is not an error (it may be created later, e.g. by the
    first upload): one WARNING naming the directory (the line carries the trigger's asset
    and watcher), then the watcher keeps checking quietly, and an INFO line when it exists.
    """

    __slots__ = ("directory", "missing", "owner")

    def __init__(self, directory: str, owner: str) -> None:
        self.directory = directory
        self.owner = owner
        self.missing = False

    def saw(self, exists: bool, *, every_s: float) -> None:
        """Record what the last check found (``every_s``: the checks' cadence, for the line)."""
        if not exists and not self.missing:
            self.missing = True
            logger.warning(
                "%s: directory %s does not exist; checking again every %.3gs (quietly) and "
                "watching it once it appears",
                self.owner,
                self.directory,
                every_s,
                extra={"action": "watch_directory_missing", "directory": self.directory},
            )
        elif exists and self.missing:
            self.missing = False
            logger.info(
                "%s: directory %s exists now; watching it",
                self.owner,
                self.directory,
                extra={"action": "watch_directory_appeared", "directory": self.directory},
            )

    def __repr__(self) -> str:
        return f"<DirectoryPresence {self.directory!r} missing={self.missing}>"


def _list_file_names(directory: str) -> list[str] | None:
    """Sorted names of the regular files in ``directory``; None if it does not exist."""
    try:
        with os.scandir(directory) as entries:
            return sorted(entry.name for entry in entries if entry.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TriggerError(
            f"cannot list directory {directory!r} for DirectoryFileDeleteTrigger: {exc}; "
            "check that it is a readable directory"
        ) from exc


class FileTrigger(BaseTrigger):
    """Fires once when ``filepath`` (a path or a glob) matches at least one regular file.

    Payload: ``{"filepath": <first match>, "matches": [<every match, sorted>]}``. ``recursive``
    lets ``**`` match any number of directories, as in ``glob.glob``.
    """

    def __init__(
        self,
        filepath: str,
        *,
        recursive: bool = False,
        poke_interval: float = DEFAULT_POKE_INTERVAL_S,
    ) -> None:
        super().__init__()
        self.filepath = os.fspath(filepath)
        self.recursive = bool(recursive)
        self.poke_interval = _check_poke_interval("FileTrigger", poke_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            classpath_of(self),
            {
                "filepath": self.filepath,
                "recursive": self.recursive,
                "poke_interval": self.poke_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import anyio.to_thread  # where the trigger polls (see the module's docstring)

        while True:
            matches = await anyio.to_thread.run_sync(_glob_files, self.filepath, self.recursive)
            if matches:
                yield TriggerEvent({"filepath": matches[0], "matches": matches})
                return
            await anyio.sleep(self.poke_interval)


class FileDeleteTrigger(BaseEventTrigger):
    """Watches one path: each time a file appears there, deletes it and fires.

    Payload: ``{"filepath": ..., "mtime": <modification time, epoch seconds>}``; the event's
    ``dedup_key`` is the file's identity and mtime (``file_dedup_key``), so each appearance
    is its own asset event, even with an equal payload.
    """

    def __init__(self, filepath: str, poke_interval: float = DEFAULT_POKE_INTERVAL_S) -> None:
        super().__init__()
        self.filepath = os.fspath(filepath)
        self.poke_interval = _check_poke_interval("FileDeleteTrigger", poke_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            classpath_of(self),
            {"filepath": self.filepath, "poke_interval": self.poke_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import anyio.to_thread  # where the trigger polls (see the module's docstring)

        directory = os.path.dirname(self.filepath) or os.curdir
        presence = DirectoryPresence(directory, f"FileDeleteTrigger for {self.filepath}")
        while True:
            there, exists = await anyio.to_thread.run_sync(_watched_file_state, self.filepath)
            presence.saw(exists, every_s=self.poke_interval)
            # On the loop: nothing may cancel between the unlink and the yield (module doc).
            info = _take_file(self.filepath) if there else None
            if info is not None:
                logger.debug(
                    "Deleted watched file %s",
                    self.filepath,
                    extra={"action": "file_delete", "trigger_id": self.trigger_id},
                )
                yield TriggerEvent(
                    {"filepath": self.filepath, "mtime": info.st_mtime},
                    dedup_key=file_dedup_key(self.filepath, info),
                )
            await anyio.sleep(self.poke_interval)


@dataclass(slots=True)
class ListingStats:
    """How many directory listings ``DirectoryFileDeleteTrigger`` streams made, per directory."""

    by_directory: dict[str, int] = field(default_factory=dict)

    def record(self, directory: str) -> None:
        self.by_directory[directory] = self.by_directory.get(directory, 0) + 1

    def count(self, directory: str | None = None) -> int:
        """Listings of ``directory``, or of every directory when None."""
        if directory is None:
            return sum(self.by_directory.values())
        return self.by_directory.get(directory, 0)

    def reset(self) -> None:
        self.by_directory.clear()


LISTING_STATS: Final = ListingStats()


class DirectoryFileDeleteTrigger(BaseEventTrigger):
    """Fires each time the flag file ``filename`` appears in ``directory``, and deletes it.

    Siblings on the same directory and cadence share one listing per ``poke_interval``
    (their ``shared_stream_key`` is equal); each one then looks for its own file name in the
    snapshot. Payload: ``{"directory": ..., "filename": ..., "filepath": ...}``; the event's
    ``dedup_key`` is the file's identity and mtime (``file_dedup_key``), so each appearance
    is its own asset event, even with an equal payload.
    """

    listing_stats: ClassVar[ListingStats] = LISTING_STATS

    def __init__(
        self, directory: str, filename: str, poke_interval: float = DEFAULT_POKE_INTERVAL_S
    ) -> None:
        super().__init__()
        if not filename or os.sep in filename or filename in (os.curdir, os.pardir):
            raise ValueError(
                f"DirectoryFileDeleteTrigger filename must be a plain file name inside "
                f"{directory!r}, got {filename!r}; put the directory part in `directory`"
            )
        self.directory = os.fspath(directory)
        self.filename = filename
        self.poke_interval = _check_poke_interval("DirectoryFileDeleteTrigger", poke_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            classpath_of(self),
            {
                "directory": self.directory,
                "filename": self.filename,
                "poke_interval": self.poke_interval,
            },
        )

    def shared_stream_key(self) -> Hashable | None:
        return ("directory-scan", self.directory, self.poke_interval)

    @classmethod
    async def open_shared_stream(
        cls, kwargs: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """List the directory once per cadence; yield ``{"directory", "names"}`` snapshots.

        Uses only ``directory`` and ``poke_interval``, the fields of the shared-stream key.
        """
        import anyio.to_thread  # where the trigger polls (see the module's docstring)

        directory = os.fspath(kwargs["directory"])
        interval_s = float(kwargs.get("poke_interval", DEFAULT_POKE_INTERVAL_S))
        presence = DirectoryPresence(directory, "DirectoryFileDeleteTrigger")
        while True:
            names = await anyio.to_thread.run_sync(_list_file_names, directory)
            cls.listing_stats.record(directory)
            presence.saw(names is not None, every_s=interval_s)
            yield {"directory": directory, "names": names or []}
            await anyio.sleep(interval_s)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncGenerator[TriggerEvent, None]:
        """Fire for this trigger's own file in each snapshot; keeps consuming afterwards."""
        async for snapshot in shared_stream:
            if not _contains(snapshot["names"], self.filename):
                continue
            event = self._take()
            if event is not None:
                yield event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # Without the shared-stream manager: the same logic, polling alone.
        stream = type(self).open_shared_stream(self.serialize()[1])
        async with aclosing(stream):
            events = self.filter_shared_stream(stream)
            async with aclosing(events):
                async for event in events:
                    yield event

    def _take(self) -> TriggerEvent | None:
        filepath = os.path.join(self.directory, self.filename)
        # Gone already (a previous round or another triggerer took it): no event. On the
        # loop: nothing may cancel between the unlink and the yield (module doc).
        info = _take_file(filepath)
        if info is None:
            return None
        logger.debug(
            "Deleted flag file %s",
            filepath,
            extra={"action": "file_delete", "trigger_id": self.trigger_id},
        )
        payload = {"directory": self.directory, "filename": self.filename, "filepath": filepath}
        return TriggerEvent(payload, dedup_key=file_dedup_key(filepath, info))


def _contains(sorted_names: list[str], name: str) -> bool:
    index = bisect.bisect_left(sorted_names, name)
    return index < len(sorted_names) and sorted_names[index] == name
