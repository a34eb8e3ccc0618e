"""The job row of one long-running part (an executor, a triggerer, the scheduler, ...), from
its insert to its end.

A part registers a ``job`` row (``running``, with its host, pid and capacity), keeps it
alive with a heartbeat every ``heartbeat_s`` (``heartbeat``: a row found no longer
``running`` is reported, others may take over the part's work), may listen for rows other
processes write (``wakeup.RowsSignal``), and marks the row ended on its way out, whatever
stopped it: that last write is shielded from cancellation and bounded by
``FINAL_WRITE_TIMEOUT_S``, and one that fails is logged (the row then goes stale, and the
others treat the part as dead once its heartbeat is older than their threshold).

``JobService.running()`` does all of it around a part's body; the steps (``start``,
``keep_alive``, ``end``) serve a part whose life is not one ``async with`` block (the
Celery worker, whose start and stop are called from Celery's threads) or that ends its job
in one transaction with rows of its own (the triggerer releases its triggers).
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Final, TypeVar

import anyio

from engine.db.queries import jobs
from engine.exceptions import DatabaseError
from engine.jobs.heartbeat import heartbeat_forever
from engine.states import JobState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from sqlalchemy.orm import Session

    from engine.db.database import Database
    from engine.jobs.wakeup import RowsSignal

__all__ = ("FINAL_WRITE_TIMEOUT_S", "JobService")

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: how long the write that ends a job may take on the way out (the database may be gone)
FINAL_WRITE_TIMEOUT_S: Final = 10.0


class JobService:
    """The job row of the part named ``part`` (in log lines: "Executor", "Triggerer", ...),
    of type ``job_type``, heartbeating every ``heartbeat_s``."""

    def __init__(
        self,
        db: Database,
        *,
        job_type: str,
        part: str,
        heartbeat_s: float,
        capacity: int | None = None,
    ) -> None:
        self._db = db
        self.job_type = job_type
        self.part = part
        self.heartbeat_s = heartbeat_s
        self.capacity = capacity
        self.job_id: int | None = None

    def __repr__(self) -> str:
        return f"<JobService {self.job_type} job_id={self.job_id}>"

    @asynccontextmanager
    async def running(self, *, wake: RowsSignal | None = None) -> AsyncIterator[int]:
        """Register the job, heartbeat it (and listen with ``wake``, started before the body)
        while the body runs, end it on the way out; yields the job id."""
        job_id = await self.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.keep_alive)
                if wake is not None:
                    await tg.start(wake.run)
                try:
                    yield job_id
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await self.end()

    async def start(self, register: Callable[[Session], int] | None = None) -> int:
        """Insert the job row and return its id. ``register``: a transaction that inserts it
        itself (``jobs.start_job``) with rows of its own, and returns its id."""
        insert = register or partial(jobs.start_job, job_type=self.job_type, capacity=self.capacity)
        self.job_id = await self._db.run(insert)
        return self.job_id

    async def keep_alive(
        self,
        *,
        on_beat: Callable[[float], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Heartbeat the job row until cancelled (``heartbeat_forever``'s hooks), every
        ``interval_s`` (default: the service's ``heartbeat_s``); ``on_beat``'s send time is
        read from ``clock``."""
        assert self.job_id is not None
        await heartbeat_forever(
            self._db,
            self.job_id,
            interval_s=interval_s or self.heartbeat_s,
            part=self.part,
            on_beat=on_beat,
            on_lost=on_lost,
            clock=clock,
        )

    async def end(
        self, release: Callable[[Session, int], T] | None = None, *, state: JobState | None = None
    ) -> T | None:
        """Mark the job row ended (``success``), in one transaction after ``release(session,
        job_id)`` (rows the job gives up) when given; returns what ``release`` returned. None
        when there is no job, or the write failed or took over ``FINAL_WRITE_TIMEOUT_S``."""
        job_id = self.job_id
        if job_id is None:
            return None

        def finish(session: Session) -> T | None:
            released = release(session, job_id) if release is not None else None
            jobs.end_job(session, job_id, state=state or JobState.SUCCESS)
            return released

        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
            try:
                return await self._db.run(finish)
            except DatabaseError as exc:
                logger.warning(
                    "%s could not mark its job %s ended: %s",
                    self.part,
                    job_id,
                    exc,
                    extra={"action": "job_end_failed", "job_id": job_id, "part": self.part},
                )
        return None
