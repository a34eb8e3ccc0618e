"""The executor part of ``sluice run`` with ``[executor] kind = "celery"``: sends tries to
Celery workers instead of starting task processes.

Theory of operation. The sender registers an ``executor`` job and heartbeats it. Its claim
loop keeps up to ``parallelism`` tries ``queued`` under its job: it moves ``scheduled`` task
instances to ``queued`` with the local executor's claim (pools, ``max_active_tasks``:
``engine.executor.admission.claim_task_instances``) and publishes one message per try,
``RUN_TRY_TASK(ti_id, sender_job_id)``, to the try's queue (the operator's ``queue=``, else
``[celery] default_queue``). A worker that takes a try over moves it to its own job, which
frees the sender's room for the next. A try still ``queued`` under the sender after
``task_queued_timeout`` is published again (a message lost with the broker, a publish that
failed): a duplicate is harmless, only one delivery can take the try over.

Beside it, the ``CallbackRunner`` runs the callback requests (DAG callbacks, callbacks of
tries whose worker died) here, as the local executor does.

Shutdown: stop claiming. Tries already queued stay queued under the sender's ended job: the
workers still take them over; a later scheduler puts the rest back to ``scheduled``
(``orphans.recover_orphaned_tasks``: a queued try never started, so it costs no try) and the
next sender sends them again.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from engine.db import models
from engine.db.queries import celery as celery_sql
from engine.db.queries import tasks
from engine.exceptions import DatabaseError
from engine.executor import admission
from engine.executor.callbacks import CallbackRunner
from engine.executor.celery.app import RUN_TRY_TASK, celery_app
from engine.executor.claiming import ClaimingExecutor
from engine.jobs.service import FINAL_WRITE_TIMEOUT_S, JobService
from engine.logs import child_environment
from engine.metrics.readings import ExecutorReading, QueueReading
from engine.retry import Backoff

if TYPE_CHECKING:
    from anyio.abc import TaskStatus
    from celery import Celery

    from engine.config import CeleryConfig
    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.executor.settings import ExecutorSettings

logger = logging.getLogger(__name__)

#: how often the sender looks for tries queued past ``task_queued_timeout`` (at most)
RESEND_CHECK_MAX_S: Final = 30.0


class CelerySender(ClaimingExecutor):
    """Claims scheduled tries and publishes them to Celery, ``parallelism`` queued at most;
    at ``shutdown`` what is queued stays for the workers."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        celery: CeleryConfig,
    ) -> None:
        super().__init__(db=db, cipher=cipher, settings=settings)
        self.celery = celery
        self._backoff = Backoff(settings.sender_poll_s)
        self._app: Celery | None = None
        self._publish_limiter = anyio.CapacityLimiter(1)  # one kombu producer at a time
        self.sent = 0
        self.resent = 0
        self.queued = 0  # tries queued under this sender at the last look
        self.sent_by_queue: Counter[str] = Counter()
        #: queue -> (queued, running) tries across the fleet, refreshed every heartbeat
        self._queue_counts: dict[str, tuple[int, int]] = {}

    def __repr__(self) -> str:
        return (
            f"CelerySender(job_id={self.job_id}, queued={self.queued}/"
            f"{self.settings.parallelism}, sent={self.sent}, resent={self.resent}, "
            f"stopping={self._stopping.is_set()})"
        )

    def metrics_reading(self) -> ExecutorReading:
        queues = tuple(
            QueueReading(name, *self._queue_counts.get(name, (0, 0)), self.sent_by_queue[name])
            for name in sorted(set(self._queue_counts) | set(self.sent_by_queue))
        )
        return self._reading(self.queued, queues)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._app = celery_app(self.celery)
        job = JobService(
            self._db,
            job_type=tasks.EXECUTOR_JOB,
            part="Celery executor",
            heartbeat_s=self.settings.heartbeat_s,
            capacity=self.settings.parallelism,
        )
        try:
            async with job.running() as job_id:
                self.job_id = job_id
                logger.info(
                    "Celery executor started job_id=%s broker=%s default_queue=%s",
                    job_id,
                    self._app.connection_for_write().as_uri(),  # without the password
                    self.celery.default_queue,
                    extra={"action": "celery_sender_started", "job_id": job_id},
                )
                await self._serve(job_id, task_status)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
                await anyio.to_thread.run_sync(self._app.close)
            logger.info("Celery executor stopped", extra={"action": "celery_sender_stopped"})

    async def _serve(self, job_id: int, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as outer:
            callbacks = CallbackRunner(
                db=self._db,
                cipher=self._cipher,
                settings=self.settings,
                environment=child_environment(os.environ, self.settings.secrets),
            )
            outer.start_soon(callbacks.run, job_id)
            outer.start_soon(self._resend_loop, job_id)
            outer.start_soon(self._count_queues)
            task_status.started()
            await self._claim_loop(job_id)
            outer.cancel_scope.cancel()

    # --- claiming and sending -----------------------------------------------------------

    async def _claim_loop(self, job_id: int) -> None:
        while not self._stopping.is_set():
            changed = self._changed
            try:
                await self._claim_and_send(job_id)
            except DatabaseError as exc:
                delay = self._backoff.failed()
                logger.warning(
                    "Claiming tasks for Celery failed (%d in a row), retrying in %.2fs: %s",
                    self._backoff.failures,
                    delay,
                    exc,
                    extra={"action": "claim_failed", "failures": self._backoff.failures},
                )
                await anyio.sleep(delay)
                continue
            self._backoff.succeeded()
            with anyio.move_on_after(self.settings.sender_poll_s):
                await changed.wait()

    async def _claim_and_send(self, job_id: int) -> None:
        self.queued = await self._db.read(partial(celery_sql.queued_count, job_id=job_id))
        free = self.settings.parallelism - self.queued
        if free <= 0:
            return
        claim = partial(
            admission.claim_task_instances,
            job_id=job_id,
            limit=free,
            now=models.utcnow(),
            warnings=self._pool_warnings,
        )
        claimed = await self._db.run(claim)
        if not claimed:
            return
        self.stats.claimed += len(claimed)
        self.queued += len(claimed)
        self.sent += await self._publish(job_id, claimed)

    async def _resend_loop(self, job_id: int) -> None:
        timeout_s = self.celery.task_queued_timeout
        interval_s = min(max(timeout_s / 4, self.settings.sender_poll_s), RESEND_CHECK_MAX_S)
        while True:
            await anyio.sleep(interval_s)
            stale = partial(
                celery_sql.stale_queued,
                job_id=job_id,
                now=models.utcnow(),
                timeout_s=timeout_s,
                limit=self.settings.parallelism,
            )
            try:
                ids = await self._db.run(stale)
            except DatabaseError as exc:
                logger.warning(
                    "Looking for tries queued too long failed: %s",
                    exc,
                    extra={"action": "celery_resend_check_failed"},
                )
                continue
            if ids:
                logger.warning(
                    "%d tr%s queued for over %gs without a worker starting them; sending again: %s",
                    len(ids),
                    "y" if len(ids) == 1 else "ies",
                    timeout_s,
                    ids,
                    extra={"action": "celery_tries_resent", "ti_ids": ids},
                )
                self.resent += await self._publish(job_id, ids)

    async def _count_queues(self) -> None:
        """Every heartbeat, the tries queued and running per queue (for the metrics)."""
        count = partial(celery_sql.queue_counts, default_queue=self.celery.default_queue)
        while True:
            try:
                self._queue_counts = await self._db.read(count)
            except DatabaseError as exc:  # the next round tries again
                logger.warning(
                    "Counting tries per queue failed: %s",
                    exc,
                    extra={"action": "celery_queue_count_failed"},
                )
            await anyio.sleep(self.settings.heartbeat_s)

    async def _publish(self, job_id: int, ti_ids: list[int]) -> int:
        """Publish one message per try; returns how many went out. A try whose message could
        not be published stays queued: ``task_queued_timeout`` sends it again."""
        found = await self._db.read(partial(celery_sql.task_queues, ti_ids=ti_ids))
        default = self.celery.default_queue
        queues = {ti_id: found.get(ti_id) or default for ti_id in ti_ids}
        send = partial(self._publish_blocking, job_id, queues)
        sent = await anyio.to_thread.run_sync(send, limiter=self._publish_limiter)
        self.sent_by_queue.update(sent)
        return len(sent)

    def _publish_blocking(self, job_id: int, queues: dict[int, str]) -> list[str]:
        """Publish in order until one fails; the queues of the messages that went out."""
        assert self._app is not None
        sent: list[str] = []
        for ti_id, queue in queues.items():
            try:
                self._app.send_task(RUN_TRY_TASK, args=(ti_id, job_id), queue=queue)
            except Exception as exc:  # noqa: BLE001 - kombu/amqp/redis errors of every kind
                logger.warning(
                    "Cannot send task instance %s to Celery queue %s (%s); it stays queued and "
                    "is sent again after [celery] task_queued_timeout",
                    ti_id,
                    queue,
                    exc,
                    extra={"action": "celery_send_failed", "ti_id": ti_id, "queue": queue},
                )
                return sent
            sent.append(queue)
        return sent
