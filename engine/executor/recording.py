"""Recording how a task step ended: its task instance's new state (with its results, outlet
events, deferral or retry time), written in one transaction guarded by the executor's job
id and retried while the metadata database is unavailable; an outcome that matches no row
(an operator action changed the task instance, or another executor took it over) is logged
and dropped.

A step that ended its try (success, skip, failure) advances its run in the same transaction
(``[scheduler] schedule_after_task_execution``, Airflow's "mini scheduler",
``engine.advancing.advance``): the tasks it made ready are ``scheduled`` at its commit, and
the run ends there when it was the last. ``Recorded`` says what that pass did, so that the
parts of the process are woken for what is left: the executor claims what was scheduled,
and the scheduler loops only when the pass did not settle the run (another transaction held
it, or a mapped task's decision needs another pass), the run ended (a queued run may start,
a held time run may be due) or the step stored outlet events (asset-triggered runs).

A local executor also claims in that transaction (``OutcomeClaims``): when the pass made
tasks ready, or when its last claim filled every slot (more work waits), the slot the step
frees takes a scheduled task at once (the same admission as its claims: pools,
``max_active_tasks``, priority) instead of a claim transaction after it; what else the pass
made ready, its claim loop takes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

import anyio

from engine.advancing.advance import Advanced, advance_run
from engine.db import models
from engine.db.queries import actions, deferrals, tasks
from engine.db.queries import callbacks as callbacks_sql
from engine.db.queries import mapping as mapping_sql
from engine.exceptions import DatabaseUnavailable
from engine.executor import admission
from engine.executor.outcomes import Decision, Outcome
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.db.queries.pools import Candidate
    from engine.db.queries.tasks import TaskRun
    from engine.execution.protocol import CallbackSpec
    from engine.executor.settings import ExecutorSettings, ExecutorStats

logger = logging.getLogger(__name__)

T = TypeVar("T")

DB_RETRY_BACKOFF_S: Final = (0.2, 5.0)


async def run_retrying(db: Database, fn: Callable[[Session], T]) -> T:
    """``fn`` in one transaction, retried while the database is unavailable."""
    delay = DB_RETRY_BACKOFF_S[0]
    while True:
        try:
            return await db.run(fn)
        except DatabaseUnavailable as exc:
            logger.warning(
                "Metadata database unavailable, retrying a task state write in %.1fs: %s",
                delay,
                exc,
                extra={"action": "task_write_retry"},
            )
            await anyio.sleep(delay)
            delay = min(delay * 2, DB_RETRY_BACKOFF_S[1])


#: the decisions that end a try: its run is advanced with them
_ENDS_TRY: Final = frozenset((Decision.SUCCEED, Decision.SKIP, Decision.FAIL))


@dataclass(frozen=True, slots=True)
class Recorded:
    """A recorded outcome (``decision``) and its run's pass in the same transaction
    (``advanced``: None when there was none, or another transaction held the run)."""

    decision: Decision
    advanced: Advanced | None = None
    outlet_events: bool = False
    #: the task steps the transaction claimed for the executor (``OutcomeClaims``); None
    #: when it made no claim
    claimed: tuple[Candidate, ...] | None = None

    @property
    def scheduled(self) -> int:
        """Task instances the pass made ``scheduled``: an executor's to claim."""
        return 0 if self.advanced is None else self.advanced.scheduled

    @property
    def triggerer_needed(self) -> bool:
        """Whether a trigger row was written for a triggerer to claim: the step deferred, or
        the pass deferred a ``start_from_trigger`` task."""
        if self.decision is Decision.DEFER:
            return True
        return self.advanced is not None and self.advanced.deferred > 0

    @property
    def scheduler_needed(self) -> bool:
        """Whether a scheduler loop has work from this outcome (see the module's text)."""
        if self.decision is Decision.DEFER:
            return False  # a deferral readies no other task
        if self.decision not in _ENDS_TRY or self.advanced is None:
            return True
        return self.advanced.ended or self.advanced.decided or self.outlet_events


class OutcomeClaims(Protocol):
    """An executor's slots, for the claim an outcome's transaction makes."""

    def claim_room(self) -> tuple[int, bool]:
        """Slots the transaction may fill, and whether to fill them even when its pass
        made nothing ready (the executor's last claim filled every slot: more work may
        wait)."""
        ...


class OutcomeRecorder:
    """Writes the outcomes of one executor's task steps (``record``)."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        stats: ExecutorStats,
        on_outcome: Callable[[Recorded], None] | None = None,
        claims: OutcomeClaims | None = None,
    ) -> None:
        self._db = db
        self._cipher = cipher
        self.settings = settings
        self.stats = stats
        self._on_outcome = on_outcome
        self._claims = claims

    def __repr__(self) -> str:
        stats = self.stats
        return f"<OutcomeRecorder outcomes={dict(stats.outcomes)} discarded={stats.discarded}>"

    async def record(
        self,
        job_id: int,
        run: TaskRun,
        outcome: Outcome,
        callback: CallbackSpec | None = None,
        *,
        external_state: str | None = None,
    ) -> None:
        write = partial(
            self._write_outcome,
            job_id=job_id,
            run=run,
            outcome=outcome,
            callback=callback,
            claim=(0, False) if self._claims is None else self._claims.claim_room(),
        )
        recorded = await run_retrying(self._db, write)
        if recorded is None:
            await self._not_recorded(job_id, run, outcome, external_state)
            return
        self.stats.outcomes[outcome.decision] += 1
        self.stats.claimed += len(recorded.claimed or ())
        self.stats.claimed_with_outcome += len(recorded.claimed or ())
        if self._on_outcome is not None:
            # the executor starts what it claimed (else claims the tasks made ready), the
            # triggerer takes a new deferral's trigger
            self._on_outcome(recorded)
        level = logging.INFO if outcome.decision is not Decision.FAIL else logging.WARNING
        logger.log(
            level,
            "Task %s.%s (run %s, try %d): %s",
            run.dag_id,
            run.task_id,
            run.run_id,
            run.try_number,
            outcome.describe(),
            extra={"action": f"task_{outcome.decision}", **run.log_fields()},
        )

    async def _not_recorded(
        self, job_id: int, run: TaskRun, outcome: Outcome, external_state: str | None
    ) -> None:
        """The outcome matched no row: an operator action changed the task instance (a
        cleared one is ``restarting``: now that its process is gone it is ``none`` again), or
        another executor took it over."""
        release = partial(actions.release_restarted_task, ti_id=run.ti_id, job_id=job_id)
        restarted = await run_retrying(self._db, release)
        if restarted or external_state is not None:
            state = TaskState.RESTARTING if restarted else external_state
            logger.info(
                "Task %s.%s (run %s, try %d): state externally set to %s; its process was "
                "stopped and its outcome (%s) not recorded%s",
                run.dag_id,
                run.task_id,
                run.run_id,
                run.try_number,
                state,
                outcome.decision,
                "; it will run again" if restarted else "",
                extra={"action": "task_externally_changed", "state": state, **run.log_fields()},
            )
            return
        self.stats.discarded += 1
        logger.warning(
            "Task instance %s was taken over while it ran here; outcome %s discarded",
            run.ti_id,
            outcome.decision,
            extra={"action": "task_outcome_discarded", **run.log_fields()},
        )

    def _write_outcome(
        self,
        session: Session,
        job_id: int,
        run: TaskRun,
        outcome: Outcome,
        callback: CallbackSpec | None = None,
        claim: tuple[int, bool] = (0, False),
    ) -> Recorded | None:
        """Record the outcome and, in the same transaction, the request to run the outcome's
        callback in a fresh process when the task's own could not (``callback``), the pass
        over its run (when the try ended) and the claim of up to ``claim[0]`` scheduled
        task steps (when the pass made some ready, or ``claim[1]``); None when no row
        matched."""
        ok = self._write_state(session, job_id, run, outcome)
        if ok and outcome.rendered_map_index is not None:
            mapping_sql.set_rendered_map_index(session, run.ti_id, outcome.rendered_map_index)
        if ok and callback is not None:
            callbacks_sql.request_task_callback(
                session,
                dag_id=run.dag_id,
                run_id=run.run_id,
                data={"callback_spec": asdict(callback)},
                now=models.utcnow(),
            )
        if not ok:
            return None
        advanced = None
        if (
            outcome.decision in _ENDS_TRY
            and self.settings.schedule_after_task_execution
            and run.run_pk is not None
        ):
            advanced = advance_run(session, self._cipher, run.run_pk)
        slots, eager = claim
        claimed = None
        if slots > 0 and (eager or (advanced is not None and advanced.scheduled)):
            now = models.utcnow()
            claimed = tuple(
                admission.claim_task_steps(session, job_id=job_id, limit=slots, now=now)
            )
        return Recorded(outcome.decision, advanced, bool(outcome.outlet_events), claimed)

    def _write_state(self, session: Session, job_id: int, run: TaskRun, outcome: Outcome) -> bool:
        now = models.utcnow()
        finish = partial(tasks.finish_task, session, run.ti_id, job_id=job_id, now=now)
        elapsed_s = outcome.elapsed_s
        if outcome.decision is Decision.SUCCEED:
            return tasks.succeed_task(
                session,
                run,
                job_id=job_id,
                elapsed_s=elapsed_s,
                now=now,
                xcoms=outcome.xcoms,
                outlet_events=list(outcome.outlet_events),
                keep_while_paused=self.settings.keep_events_while_paused,
                skip_task_ids=outcome.skip_task_ids,
            )
        if outcome.decision is Decision.SKIP:
            return finish(state=TaskState.SKIPPED, elapsed_s=elapsed_s)
        if outcome.decision is Decision.FAIL:
            return finish(state=TaskState.FAILED, elapsed_s=elapsed_s)
        if outcome.decision is Decision.RETRY:
            assert outcome.retry_at is not None
            return tasks.retry_task(
                session,
                run.ti_id,
                job_id=job_id,
                elapsed_s=elapsed_s,
                now=now,
                retry_at=outcome.retry_at,
            )
        if outcome.decision is Decision.DEFER:
            assert outcome.deferral is not None
            trigger_id = deferrals.defer_task(
                session,
                self._cipher,
                run.ti_id,
                job_id=job_id,
                deferral=outcome.deferral,
                trigger_timeout=outcome.trigger_timeout,
                elapsed_s=elapsed_s,
                xcoms=outcome.xcoms,  # what it pushed before it deferred
            )
            return trigger_id is not None
        return tasks.requeue_task(session, run.ti_id, job_id=job_id)
