"""The triggerer: claims trigger rows, runs them in one event loop, persists what they fire.

One ``job`` row with heartbeats (``engine.jobs.service``); a claim loop (``claim_loop``)
whose rounds take unassigned rows and rows of dead triggerers up to the remaining capacity
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL) and stop locally every trigger whose row is no
longer ours; one outbox drained by one persister; a loop watchdog; periodic clean-up of
unreferenced rows and of deferrals past their timeout. Deferred-task and watcher triggers
(shared-stream subscribers among them) share this runtime."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from engine.authoring.external_task_trigger import MetadataReadingTrigger
from engine.db.queries import claims as store_claims
from engine.db.queries import jobs, streams
from engine.db.queries import triggers as trigger_rows
from engine.exceptions import DatabaseUnavailable, LeaseLost, SluiceError, TriggerLoadError
from engine.jobs.service import JobService
from engine.jobs.wakeup import RowsSignal
from engine.metrics.readings import HistogramReading, TriggererReading
from engine.retry import Backoff
from engine.states import JobState, TriggerKind
from engine.triggerer import claiming
from engine.triggerer.claim_loop import ClaimLoop
from engine.triggerer.claim_reports import in_its_group, report_claim
from engine.triggerer.collector import collector_tuned
from engine.triggerer.connections import database_lookup
from engine.triggerer.housekeeping import clean_forever, publish_stream_stats_forever
from engine.triggerer.lease import Lease, carried_over
from engine.triggerer.loading import Loaded, load_rows
from engine.triggerer.metadata import DatabaseMetadataReader
from engine.triggerer.outbox import Outbox, TriggerFailed
from engine.triggerer.persister import BatchResult, Persister
from engine.triggerer.runtime import TriggerRunner
from engine.triggerer.watchdog import LoopWatchdog
from shared_stream import SharedStreamManager

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.triggerer.settings import TriggererSettings

logger = logging.getLogger(__name__)

LOAD_RETRY_S: Final = 30.0
START_CHUNK: Final = 200
REGISTER_RETRY_S: Final = 0.5  # first backoff of a new life's job registration
CLAIM_CHUNK: Final = 5000


class Triggerer:
    """Runs claimed triggers; ``run()`` until ``shutdown()``."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: TriggererSettings,
        on_committed: Callable[[BatchResult], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        #: the lease's clock, which its heartbeats' send times are read from (a test's may
        #: stand still)
        self._monotonic = monotonic
        self._cipher = cipher
        self._connections = database_lookup(db, cipher)  # kafka_config_id, aws_conn_id, ...
        self.settings = settings
        self._metadata = DatabaseMetadataReader(db)  # for triggers that read the database
        self._on_committed = on_committed
        self.job_id: int | None = None
        self._stopping = anyio.Event()
        self._claims = 0
        self.leases_lost = 0
        self._build_runtime()
        self._job = JobService(
            db,
            job_type=jobs.TRIGGERER_JOB,
            part="Triggerer",
            heartbeat_s=settings.heartbeat_s,
            capacity=settings.capacity,
        )

    def _build_runtime(self) -> None:
        """What one life of the triggerer (one job row) runs: the outbox, the shared
        streams, the runner, the persister, the claim loop and the lease."""
        settings, db = self.settings, self._db
        self.lease = Lease(threshold_s=settings.health_check_threshold_s, clock=self._monotonic)
        self.outbox = Outbox()
        self.shared_streams = SharedStreamManager(
            max_subscriber_queue=settings.subscriber_queue_size,
            ack_timeout=settings.ack_timeout_s,
            cohort_grace_period=settings.cohort_grace_period_s,
            cohort_return=settings.cohort_return_s,
            may_advance=self.lease.holds,
        )
        self.runner = TriggerRunner(
            outbox=self.outbox,
            shared_streams=self.shared_streams,
            cleanup_timeout_s=settings.cleanup_timeout_s,
            restart_backoff_s=settings.restart_backoff_s,
        )
        self.persister = Persister(
            db=db,
            outbox=self.outbox,
            confirm=self.shared_streams.confirm_persisted,
            refuse=self.shared_streams.refuse_persisted,
            on_committed=self._on_committed,
            max_payload_bytes=settings.max_asset_event_payload_bytes,
            keep_events_while_paused=settings.keep_events_while_paused,
            on_lease_lost=self._lose_lease,
        )
        self.watchdog = LoopWatchdog(settings.blocked_threshold_s)
        self._load_failed: dict[int, float] = {}
        self._recovered: set[int] = set()  # started fine although their row records a failure
        self._rehome: dict[int, str] = {}  # claimed rows to hand back to their group (digest)
        self._holds_groups = False  # as of the last claim round
        self.claim_loop = ClaimLoop(
            sync_once=self.sync_once,
            probe=self._has_claimable,
            claims=lambda: self._claims,
            idle_interval_s=settings.claim_idle_interval_s,
            poll_s=settings.new_trigger_poll_s,
        )
        self.new_rows = RowsSignal(
            db,
            self.claim_loop.signal,
            listen=store_claims.LISTEN_NEW_TRIGGER_ROWS,
            what="new trigger rows",
        )

    def _lose_lease(self, reason: str) -> None:
        """The job row is no longer this triggerer's (or it cannot tell): stop every
        consumer now, before anything else runs; ``Lease.watch`` then ends this life."""
        self.lease.lose(reason)
        self._fence(reason)

    def _fence(self, reason: str) -> None:
        if self.shared_streams.fenced is not None:
            return
        logger.error(
            "Triggerer job %s lost its lease: %s. Its consumers leave their brokers now; "
            "nothing more is stored or acknowledged under this job, what was not stored is "
            "redelivered to the rows' new owner; starting again as a new job",
            self.job_id,
            reason,
            extra={"action": "triggerer_lease_lost", "job_id": self.job_id},
        )
        self.shared_streams.fence(reason)

    def __repr__(self) -> str:
        return (
            f"Triggerer(job_id={self.job_id}, running={len(self.runner)}, "
            f"capacity={self.settings.capacity}, outbox={len(self.outbox)})"
        )

    # --- lifecycle ----------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until ``shutdown()``; a life whose lease was lost is followed by a new one
        (a new job row, nothing carried over: the brokers redeliver what it did not store)."""
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        while True:
            lost = False
            try:
                await self._live(mark_started, again=self.leases_lost > 0)
            except* LeaseLost:
                lost = True
            if not lost or self._stopping.is_set():
                return
            self.leases_lost += 1
            taken = [*self.persister.unwritten(), *self.outbox.take_all()]
            carried = carried_over(taken, job_id=self.job_id)
            self._build_runtime()
            for item in carried:
                self.outbox.put_nowait(item)

    async def _register(self, *, again: bool) -> int | None:
        """Insert this life's job row and start its lease; a life after a lost lease (the
        database may be what it lost) retries with a backoff until the row is in, or
        returns None on shutdown."""
        backoff = Backoff(REGISTER_RETRY_S)
        while True:
            sent_at = self._monotonic()
            try:
                job_id = await self._job.start()
                self.lease.renewed(sent_at)  # the row's first heartbeat is its insert
                return job_id
            except DatabaseUnavailable as exc:
                if not again:
                    raise
                delay = backoff.failed()
                logger.warning(
                    "Triggerer cannot register its new job yet: %s; retrying in %.1fs",
                    exc,
                    delay,
                    extra={"action": "triggerer_register_retry"},
                )
            with anyio.move_on_after(delay):
                await self._stopping.wait()
            if self._stopping.is_set():
                return None

    async def _live(self, started: Callable[[], None], *, again: bool) -> None:
        job_id = await self._register(again=again)
        if job_id is None:  # shut down while the database was away
            started()
            return
        self.job_id = job_id
        logger.info(
            "Triggerer started job_id=%s capacity=%d",
            job_id,
            self.settings.capacity,
            extra={"action": "triggerer_started", "job_id": self.job_id},
        )
        try:
            with collector_tuned(self.settings.gc_young_threshold):
                await self._serve(job_id, started)
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish()

    async def _serve(self, job_id: int, started: Callable[[], None]) -> None:
        self.persister.owner = job_id
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.lease.watch, self._fence)
            await tg.start(self.watchdog.run)
            await tg.start(self.shared_streams.run)
            await tg.start(self.runner.run)
            tg.start_soon(self.persister.run)
            tg.start_soon(
                partial(
                    self._job.keep_alive,
                    on_beat=self.lease.renewed,
                    on_lost=partial(self._lose_lease, f"job {job_id} is no longer running"),
                    # Twice per period: the lease outlives a slow or missed beat.
                    interval_s=self.settings.heartbeat_s / 2,
                    clock=self._monotonic,
                )
            )
            tg.start_soon(
                partial(
                    clean_forever,
                    self._db,
                    threshold_s=self.settings.health_check_threshold_s,
                    interval_s=self.settings.cleanup_interval_s,
                )
            )
            tg.start_soon(
                partial(
                    publish_stream_stats_forever,
                    self._db,
                    self.shared_streams.stats,
                    job_id=job_id,
                    interval_s=self.settings.heartbeat_s,
                )
            )
            await tg.start(self.new_rows.run)
            await tg.start(self.claim_loop.run)
            started()
            await self._stopping.wait()
            await self._drain(tg)

    def shutdown(self) -> None:
        """Begin a graceful stop: no more claims, stop triggers, flush, release rows."""
        self._stopping.set()
        self.claim_loop.stop()

    def nudge(self) -> None:
        """Claim now: new trigger rows were written in this process (e.g. a task deferred)."""
        self.claim_loop.nudge()

    def metrics_reading(self, *, with_groups: bool = True) -> TriggererReading:
        """This triggerer's counters now (``with_groups=False``: off the loop thread)."""
        stats = self.persister.stats
        return TriggererReading(
            job_id=self.job_id,
            running=len(self.runner),
            capacity=self.settings.capacity,
            events_fired=self.runner.events_fired,
            failures_reported=self.runner.failures_reported,
            outbox_pending=len(self.outbox),
            events_persisted=stats.events,
            events_refused=stats.refused,
            asset_events_created=stats.asset_events,
            tasks_resumed=stats.tasks_resumed,
            failures_persisted=stats.failures_recorded,
            persist_dropped=stats.dropped,
            batch_size=HistogramReading.of(stats.batch_size),
            commit_s=HistogramReading.of(stats.commit_s),
            blocked_loops=self.watchdog.blocked_count,
            groups=tuple(self.shared_streams.stats()) if with_groups else None,
        )

    async def _drain(self, tg: anyio.abc.TaskGroup) -> None:
        """Stop in the order that loses nothing and fails nothing.

        1. Store (and confirm) every event already fired, so its broker event can advance.
        2. Stop the triggers; each shared-stream group then advances its resolved prefixes
           and abandons the rest for redelivery (a shutdown is not a subscriber failure).
        3. Store what fired meanwhile (its broker events are redelivered: dedup absorbs them).
        """
        grace = self.settings.shutdown_grace_s
        await self._take_no_more()
        logger.info(
            "Triggerer stopping: %d trigger(s) running",
            len(self.runner),
            extra={"action": "triggerer_stopping"},
        )
        with anyio.move_on_after(grace, shield=True):
            await self.persister.wait_flushed()
        self.shared_streams.begin_shutdown()
        await self.runner.aclose(grace_s=grace)
        with anyio.move_on_after(grace, shield=True):
            await self.shared_streams.stop_all()
        self.outbox.close()
        with anyio.move_on_after(grace, shield=True):
            await self.persister.run()
        tg.cancel_scope.cancel()

    async def _take_no_more(self) -> None:
        """Say in the job row that this triggerer has no room left: it keeps heartbeating
        while it drains, and a group waiting for a triggerer with room must not wait for it."""
        job_id = self.job_id
        assert job_id is not None
        with anyio.move_on_after(self.settings.shutdown_grace_s, shield=True):
            try:
                await self._db.run(lambda session: jobs.set_job_capacity(session, job_id, 0))
            except SluiceError as exc:
                logger.warning(
                    "Could not mark the job as taking no more triggers: %s",
                    exc,
                    extra={"action": "triggerer_stopping", "job_id": job_id},
                )

    async def _finish(self) -> None:
        """Release this triggerer's trigger rows and stream snapshots, and end its job, in
        one transaction."""

        def release(session: Session, job_id: int) -> int:
            count = trigger_rows.release_triggers(session, triggerer_id=job_id)
            streams.delete_stream_snapshots(session, triggerer_id=job_id)
            return count

        lost = self.lease.lost is not None
        released = await self._job.end(release, state=JobState.FAILED if lost else None)
        if released is not None:
            logger.info(
                "Triggerer stopped, released %d trigger row(s)",
                released,
                extra={"action": "triggerer_stopped", "job_id": self.job_id},
            )

    async def _has_claimable(self) -> bool:
        """Whether an unassigned row waits that a round would take (one indexed probe): any
        row while there is room, else only one of a group this triggerer holds."""
        job_id = self.job_id
        assert job_id is not None
        has_room = len(self.runner) < self.settings.capacity
        if not has_room and not self._holds_groups:
            return False  # nothing to take: full, and no group of its own to join
        query = partial(store_claims.has_claimable_triggers, triggerer_id=job_id, has_room=has_room)
        return await self._db.read(query)

    # --- one sync: stop what is no longer ours, claim, start ---------------------------

    async def sync_once(self) -> bool:
        """One claim round; True when capacity was filled (more rows may be waiting)."""
        assert self.job_id is not None
        job_id, s = self.job_id, self.settings
        # At most CLAIM_CHUNK rows per round: one huge claim holds the write lock, stalls the
        # loop while the worker thread decrypts, and leaves its peak memory resident.
        room = max(0, s.capacity - len(self.runner))
        left = min(room, CLAIM_CHUNK)
        now = time.monotonic()
        retry = {t for t, failed_at in self._load_failed.items() if now - failed_at >= LOAD_RETRY_S}
        sync = partial(
            claiming.sync_round,
            triggerer_id=job_id,
            capacity_left=room,
            single_limit=left,
            threshold_s=s.health_check_threshold_s,
            expected=self._expected_checksum(),
            retry=retry,
        )
        recovered, self._recovered = self._recovered, set()
        rehome, self._rehome = self._rehome, {}
        try:
            needed = partial(claiming.round_needs_prepare, recovered=recovered, rehome=rehome)
            if await self._db.read(needed):
                await self._db.run(
                    partial(
                        claiming.prepare_round,
                        triggerer_id=job_id,
                        recovered=recovered,
                        rehome=rehome,
                    )
                )
            synced = await self._db.run(sync)
        except SluiceError:
            self._recovered |= recovered  # cleared by the next round
            self._rehome = rehome | self._rehome
            raise
        result, owned, served = synced.claim, synced.owned, synced.served
        rows, self._holds_groups = result.rows, result.holds_groups
        report_claim(result)
        if owned is not None:
            self._stop_unowned(owned | {row.id for row in rows})
            self._load_failed = {t: at for t, at in self._load_failed.items() if t in owned}
        for row in rows:
            self._load_failed.pop(row.id, None)
        self._claims += len(rows)
        # Decrypted and imported after the commit: the claim holds no lock meanwhile.
        load = partial(
            load_rows,
            rows,
            served,
            cipher=self._cipher,
            allowed_modules=s.allowed_modules,
            plugins_folder=s.plugins_folder,
            lookup=self._connections,
        )
        loaded = await anyio.to_thread.run_sync(load) if rows else []
        for index, item in enumerate(loaded, start=1):
            self._start(item)
            if index % START_CHUNK == 0:
                # Let the started triggers take their first step in small batches: thousands
                # at once would block the loop (and the watchdog would rightly say so).
                await anyio.lowlevel.checkpoint()
        # Rows to hand back to their group are written by the next round, at once.
        return bool(self._rehome) or (left > 0 and len(loaded) >= left)

    def _expected_checksum(self) -> tuple[int, int]:
        """(count, sum of ids) of the rows this triggerer runs or failed to load."""
        count, total = self.runner.id_checksum()
        failed = [t for t in self._load_failed if t not in self.runner]
        return count + len(failed), total + sum(failed)

    def _stop_unowned(self, owned: set[int]) -> None:
        for trigger_id in self.runner.running_ids() - owned:
            logger.info(
                "Trigger %s is no longer assigned here, stopping it",
                trigger_id,
                extra={"action": "trigger_unassigned", "trigger_id": trigger_id},
            )
            self.runner.stop(trigger_id)

    def _start(self, item: Loaded) -> None:
        row, kind = item.row, item.kind
        try:
            trigger = item.instantiate()
        except TriggerLoadError as exc:
            self._load_failure(row.id, kind, exc)
            return
        if not in_its_group(row, trigger, self._rehome):
            return
        if isinstance(trigger, MetadataReadingTrigger):
            trigger.attach_metadata(self._metadata)
        self.runner.start(item.spec(trigger))
        if row.has_error and kind is TriggerKind.WATCHER:
            self._recovered.add(row.id)

    def _load_failure(self, trigger_id: int, kind: TriggerKind, exc: TriggerLoadError) -> None:
        logger.error(
            "Trigger %s cannot be loaded: %s",
            trigger_id,
            exc,
            extra={"action": "trigger_load_failed", "trigger_id": trigger_id},
        )
        self._load_failed[trigger_id] = time.monotonic()
        self.outbox.put_nowait(
            TriggerFailed(
                trigger_id=trigger_id,
                kind=kind,
                reason=f"{trigger_rows.LOAD_FAILURE_PREFIX}: {exc}",
                traceback=None,
                will_restart=False,
            )
        )
