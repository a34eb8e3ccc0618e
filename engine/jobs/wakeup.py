"""Wake a claim loop as soon as another process may have written a row it would take.

Without it, a running triggerer finds rows written by other processes (a task deferred by
an executor, a watcher added by the DAG processor, rows released by a triggerer that shut
down) at its next probe, every ``new_trigger_poll_s``, and an executor finds task instances
another process made ``scheduled`` (the scheduler, a triggerer resuming a deferred task) at
its next claim poll: a burst of 1,000 new trigger rows waited between 0 and a whole poll
interval before the first of them was claimed, which was most of the time it took to start
them all. ``RowsSignal`` calls ``on_signal()`` instead:

- PostgreSQL: ``LISTEN`` on a channel, on a connection of its own; row triggers notify it
  when a transaction writes the rows it is about (migration 0018: trigger rows inserted or
  left unassigned, ``claims.LISTEN_NEW_TRIGGER_ROWS``; migration 0019: task instances made
  ``scheduled``, ``tasks.LISTEN_SCHEDULED_TASKS``), at commit, one notification per
  transaction and channel.
- SQLite in a file: inotify on the database's directory; every commit writes the WAL
  (``<db>-wal``), whichever process makes it. The first write after a quiet spell signals
  at once; further ones signal at most once per ``SQLITE_SIGNAL_GAP_S`` (one trailing
  signal covers all of a gap's commits). Every part of a busy engine commits several times
  per task step, so a signal per commit cost the claim loops a probe each: 6 probes per
  defer cycle, 6 ms of its 32.
- Otherwise (in-memory SQLite, no inotify): nothing; the poll finds the rows.

A signal only means "look now": a claim loop answers it with a cheap indexed probe, so a
signal for a row it would not take (or, on SQLite, for any commit, its own ones included)
costs one probe, and signals that arrive while it probes or claims are coalesced into one.
A signal lost while the listener reconnects costs at most a poll interval: the poll stays.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import anyio

from engine.db.listen import can_listen, listening, sqlite_file
from engine.exceptions import DatabaseUnavailable
from engine.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from anyio.abc import TaskStatus

    from engine.db.database import Database

__all__ = ("RowsSignal", "SignalGap")

logger = logging.getLogger(__name__)

RECONNECT_BASE_S: Final = 1.0
SQLITE_SIGNAL_GAP_S: Final = 0.05  # at most one signal per gap from SQLite's WAL (see above)


class RowsSignal:
    """Calls ``on_signal()`` when another process may have written rows of ``what`` (words
    for the logs, "new trigger rows" say), notified on PostgreSQL by ``listen``'s channel."""

    def __init__(
        self,
        db: Database,
        on_signal: Callable[[], None],
        *,
        listen: str,
        what: str,
        ignore_payload: str | None = None,
    ) -> None:
        self._db = db
        self._on_signal = on_signal
        self._listen = listen
        self._what = what
        # PostgreSQL: a notification with this payload is not a signal (the writer, in this
        # process, woke the part itself when it had to: ``listen.notify_scheduler``)
        self._ignore_payload = ignore_payload
        self.source = _source_of(db)  # "postgresql", "sqlite-wal" or None (poll only)
        # The SQLite database file (its directory is watched); None on PostgreSQL.
        self._file = sqlite_file(db) if self.source == "sqlite-wal" else None

    def __repr__(self) -> str:
        return f"<RowsSignal {self._what}: {self.source or 'poll only'}>"

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled (``task_status`` is started once listening, or at once when
        there is nothing to listen to)."""
        if self.source == "postgresql":
            await self._listen_postgres(task_status)
        elif self.source == "sqlite-wal":
            await self._watch_sqlite(task_status)
        else:
            task_status.started()

    # -- PostgreSQL ----------------------------------------------------------------------

    async def _listen_postgres(self, task_status: TaskStatus[None]) -> None:
        backoff, started = Backoff(RECONNECT_BASE_S), False
        while True:
            try:
                async with listening(self._db, self._listen) as notifications:
                    backoff.succeeded()
                    self._on_signal()  # rows written while it was not listening
                    if not started:
                        task_status.started()
                        started = True
                    ignored = self._ignore_payload
                    async for notify in notifications:
                        if ignored is None or getattr(notify, "payload", None) != ignored:
                            self._on_signal()
            except DatabaseUnavailable as exc:
                retry_in = backoff.failed()
                logger.warning(
                    "Cannot listen for %s (%s); polling meanwhile, retrying in %.1fs",
                    self._what,
                    exc,
                    retry_in,
                    extra={
                        "action": "rows_listen_failed",
                        "rows": self._what,
                        "failures": backoff.failures,
                    },
                )
                if not started:
                    task_status.started()
                    started = True
                await anyio.sleep(retry_in)

    # -- SQLite --------------------------------------------------------------------------

    async def _watch_sqlite(self, task_status: TaskStatus[None]) -> None:
        from asyncinotify import Inotify, Mask

        database = self._file
        assert database is not None
        names = {database.name, f"{database.name}-wal"}
        # Either can fail with OSError: the per-user limit of inotify instances or watches.
        try:
            inotify = Inotify()
        except OSError as exc:
            _cannot_watch(database.parent, self._what, exc, task_status)
            return
        try:
            inotify.add_watch(database.parent, Mask.MODIFY | Mask.CREATE | Mask.MOVED_TO)
        except OSError as exc:
            inotify.close()
            _cannot_watch(database.parent, self._what, exc, task_status)
            return
        gap = SignalGap(self._on_signal, SQLITE_SIGNAL_GAP_S)
        with inotify:
            async with anyio.create_task_group() as tg:
                tg.start_soon(gap.run)
                task_status.started()
                async for event in inotify:
                    if event.name is not None and event.name.name in names:
                        gap.note()


class SignalGap:
    """Calls ``on_signal()`` at once for the first ``note()`` after a quiet spell, then at
    most once per ``gap_s``: the notes made during a gap get one call when it ends."""

    def __init__(
        self,
        on_signal: Callable[[], None],
        gap_s: float,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self._on_signal = on_signal
        self._gap_s = gap_s
        self._sleep = sleep
        self._noted = anyio.Event()

    def note(self) -> None:
        self._noted.set()

    async def run(self) -> None:
        while True:
            await self._noted.wait()
            self._noted = anyio.Event()
            self._on_signal()
            await self._sleep(self._gap_s)


def _cannot_watch(folder: Path, what: str, exc: OSError, task_status: TaskStatus[None]) -> None:
    logger.warning(
        "Cannot watch %s for %s (%s); they are found by the poll",
        folder,
        what,
        exc,
        extra={"action": "rows_watch_failed", "rows": what},
    )
    task_status.started()


def _source_of(db: Database) -> str | None:
    if can_listen(db):
        return "postgresql"
    if sqlite_file(db) is not None and _has_inotify():
        return "sqlite-wal"
    return None


def _has_inotify() -> bool:
    try:
        import asyncinotify  # noqa: F401 - Linux only
    except (ImportError, OSError):
        return False
    return True
