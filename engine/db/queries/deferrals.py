"""SQL of task instances deferred on a trigger: deferring (trigger row and ``deferred`` state
in one transaction), starting from a trigger, resuming or ending a task when its trigger
fires or fails, and failing deferrals whose timeout passed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, select, update

from engine.authoring.deferral import FAIL_METHOD, TRIGGER_FAILED_ERROR, TRIGGER_TIMEOUT_ERROR
from engine.db.database import rowcount
from engine.db.models import DagRun, DagTask, TaskInstance, utcnow
from engine.db.queries import assets
from engine.db.queries import triggers as trigger_rows
from engine.db.queries.tasks import held_by
from engine.exceptions import DecryptionError
from engine.states import TaskState, TriggerKind
from triggers.exceptions import SerializationError
from triggers.serde import dumps, loads, loads_kwargs

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement
    from sqlalchemy.orm import Session

    from engine.authoring.deferral import Deferral
    from engine.crypto import KwargsCipher

logger = logging.getLogger(__name__)


def resume_deferred_tasks(
    session: Session, trigger_id: int, *, next_method: str | None, next_kwargs: dict[str, Any]
) -> int:
    """Move every task still deferred on ``trigger_id`` to ``scheduled``; 0 if none left.

    ``next_method=None`` keeps each task's own ``next_method``.
    """
    values: dict[str, Any] = {
        "state": TaskState.SCHEDULED,
        "next_kwargs": dumps(next_kwargs, where="next_kwargs"),
        "trigger_id": None,
        "trigger_timeout": None,
    }
    if next_method is not None:
        values["next_method"] = next_method
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED)
        .values(**values)
    )
    return rowcount(result)


def end_deferred_tasks(
    session: Session,
    trigger_id: int,
    *,
    state: str,
    xcoms: dict[str, Any] | None = None,
    keep_while_paused: bool = True,
) -> int:
    """End tasks deferred on ``trigger_id`` from the triggerer (``end_from_trigger``).

    ``xcoms`` (tagged JSON per key, as the executor stores a returned value) become the
    tasks' results; None leaves them as they are. A task that ends in ``success`` updates
    its outlets' assets in the same transaction, as a task ending on a worker does. A task
    the trigger ends ``failed`` that has retries left gets them, as a try failing on a worker
    does: it goes back to a worker at ``__fail__`` (``TRIGGER_FAILED_ERROR``), which fails
    the try through the usual path (retry delay, ``on_retry_callback``); counted as ended.
    """
    retried = 0
    if state == TaskState.FAILED:
        retried = _fail_on_a_worker(session, trigger_id, error=TRIGGER_FAILED_ERROR)
    now = utcnow()
    values: dict[str, Any] = {
        "state": state,
        "end_date": now,
        "trigger_id": None,
        "trigger_timeout": None,
    }
    if xcoms is not None:
        _merge_results(session, trigger_id, xcoms)
    ended = session.execute(
        update(TaskInstance)
        .where(TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED)
        .values(**values)
        .returning(TaskInstance.id)
    ).scalars()
    ended_ids = [int(i) for i in ended]  # what this transaction ended: its outlets, once
    if state == TaskState.SUCCESS and ended_ids:
        rows = session.execute(
            select(
                TaskInstance.id,
                TaskInstance.dag_id,
                DagRun.run_id,
                TaskInstance.task_id,
                TaskInstance.try_number,
                DagTask.outlets,
                DagRun.partition_key,
            )
            .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
            .outerjoin(
                DagTask,
                and_(
                    DagTask.dag_id == TaskInstance.dag_id, DagTask.task_id == TaskInstance.task_id
                ),
            )
            .where(TaskInstance.id.in_(ended_ids))
        ).all()
        for ti_id, dag_id, run_id, task_id, try_number, outlets, partition_key in rows:
            source = assets.TaskTry(int(ti_id), dag_id, run_id, task_id, int(try_number))
            events = [
                {"asset": name, "extra": {}, "alias": None, "partition_key": partition_key}
                for name in outlets or []
            ]
            assets.record_task_outlet_events(
                session, source, events, keep_while_paused=keep_while_paused, now=now
            )
    return retried + len(ended_ids)


def _merge_results(session: Session, trigger_id: int, xcoms: dict[str, Any]) -> None:
    """The event's results over what each task pushed before it deferred."""
    rows = session.execute(
        select(TaskInstance.id, TaskInstance.xcoms).where(
            TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED
        )
    ).all()
    for ti_id, kept in rows:
        merged = {**(kept if isinstance(kept, dict) else {}), **xcoms}
        session.execute(update(TaskInstance).where(TaskInstance.id == ti_id).values(xcoms=merged))


def _fail_on_a_worker(session: Session, trigger_id: int, *, error: str) -> int:
    """Send the tasks deferred on ``trigger_id`` that have retries left to ``__fail__``."""
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.trigger_id == trigger_id,
            TaskInstance.state == TaskState.DEFERRED,
            TaskInstance.try_number <= TaskInstance.max_tries,
        )
        .values(
            state=TaskState.SCHEDULED,
            next_method=FAIL_METHOD,
            next_kwargs=dumps({"error": error}, where="next_kwargs"),
            trigger_id=None,
            trigger_timeout=None,
        )
    )
    return rowcount(result)


def _timed_out(now: datetime) -> ColumnElement[bool]:
    return and_(
        TaskInstance.state == TaskState.DEFERRED,
        TaskInstance.trigger_timeout.is_not(None),
        TaskInstance.trigger_timeout <= now,
    )


def has_timed_out_deferrals(session: Session, *, now: datetime | None = None) -> bool:
    """Whether a task is deferred past its timeout: a read, so that a triggerer's round
    takes the write lock for ``fail_timed_out_deferrals`` only when there is one."""
    found = session.execute(
        select(TaskInstance.id).where(_timed_out(now or utcnow())).limit(1)
    ).first()
    return found is not None


def fail_timed_out_deferrals(session: Session, *, now: datetime | None = None) -> list[int]:
    """Fail (``__fail__``, "trigger timeout") tasks deferred past their timeout.

    Their triggers go at once (unless something else still uses them), so the triggerer
    stops them at its next sync instead of running a trigger nobody waits for until the
    periodic clean-up.
    """
    expired = _timed_out(now or utcnow())
    rows = session.execute(select(TaskInstance.id, TaskInstance.trigger_id).where(expired)).all()
    ids = [int(row.id) for row in rows]
    if ids:
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.id.in_(ids), expired)
            .values(
                state=TaskState.SCHEDULED,
                next_method=FAIL_METHOD,
                next_kwargs=dumps({"error": TRIGGER_TIMEOUT_ERROR}),
                trigger_id=None,
                trigger_timeout=None,
            )
        )
        trigger_rows.delete_unused_triggers(
            session, {int(r.trigger_id) for r in rows if r.trigger_id}
        )
    return ids


def deferral_deadline(
    now: datetime,
    timeout_s: float | None,
    try_started: datetime | None,
    execution_timeout_s: float | None,
) -> datetime | None:
    """When a deferral times out: the earlier of ``defer(timeout=)`` and the try's
    ``execution_timeout`` deadline (which counts deferrals); None when neither is set."""
    candidates = []
    if timeout_s is not None:
        candidates.append(now + timedelta(seconds=timeout_s))
    if execution_timeout_s is not None:
        candidates.append((try_started or now) + timedelta(seconds=execution_timeout_s))
    return min(candidates) if candidates else None


def defer_task(
    session: Session,
    cipher: KwargsCipher,
    ti_id: int,
    *,
    job_id: int,
    deferral: Deferral,
    trigger_timeout: datetime | None,
    elapsed_s: float,
    xcoms: dict[str, Any] | None = None,
) -> int | None:
    """Store the trigger (kwargs encrypted) and move the task to ``deferred``, in one
    transaction; returns the trigger id, or None if the task is no longer ours. ``xcoms``
    (what the try pushed before it deferred) are stored at once, as Airflow stores a push:
    the resumed try reads them and keeps them."""
    held = session.execute(  # locked: an operator action cannot slip in before the update
        select(TaskInstance.id).where(held_by(ti_id, job_id, TaskState.RUNNING)).with_for_update()
    ).scalar()
    if held is None:
        return None
    trigger_id = trigger_rows.add_trigger_row(
        session,
        cipher,
        deferral.classpath,
        loads_kwargs(deferral.trigger_kwargs),
        kind=TriggerKind.TASK,
    )
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.id == ti_id)
        .values(
            state=TaskState.DEFERRED,
            trigger_id=trigger_id,
            next_method=deferral.method_name,
            next_kwargs=deferral.kwargs,
            trigger_timeout=trigger_timeout,
            runtime_s=TaskInstance.runtime_s + elapsed_s,
            deferral_count=TaskInstance.deferral_count + 1,
            executor_job_id=None,
            pid=None,
            **({"xcoms": xcoms} if xcoms else {}),
        )
    )
    return trigger_id


def _decode_start_trigger(cipher: KwargsCipher, token: str, where: str) -> dict[str, Any] | None:
    try:
        document = loads(cipher.decrypt(token))
        if not isinstance(document, dict):
            raise SerializationError("not a mapping")
        document["kwargs"] = loads_kwargs(str(document["kwargs"]))
        return document
    except (DecryptionError, SerializationError, KeyError) as exc:
        logger.warning(
            "Cannot read the stored start_trigger_args of %s (%s); it will start on a worker",
            where,
            exc,
            extra={"action": "start_trigger_unreadable"},
        )
        return None


def start_from_trigger(session: Session, cipher: KwargsCipher, ti_id: int) -> bool:
    """Defer a ``scheduled`` start_from_trigger task straight to the triggerer (no worker).

    Writes its trigger row and the ``deferred`` state; this starts a fresh try. False when
    the task has no stored trigger args (or they cannot be read): the executor then runs
    it, and the task defers through ``deferral_at_start`` instead.
    """
    row = session.execute(
        select(TaskInstance.state, DagTask.start_trigger, DagTask.execution_timeout_s)
        .join(
            DagTask,
            and_(DagTask.dag_id == TaskInstance.dag_id, DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.id == ti_id)
    ).first()
    if row is None or row[0] != TaskState.SCHEDULED or row[1] is None:
        return False
    args = _decode_start_trigger(cipher, row[1], f"task instance {ti_id}")
    if args is None:
        return False
    now = utcnow()
    trigger_id = trigger_rows.add_trigger_row(
        session, cipher, str(args["classpath"]), args["kwargs"], kind=TriggerKind.TASK
    )
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.id == ti_id, TaskInstance.state == TaskState.SCHEDULED)
        .values(
            state=TaskState.DEFERRED,
            trigger_id=trigger_id,
            next_method=str(args["next_method"]),
            next_kwargs=str(args["next_kwargs"]),
            trigger_timeout=deferral_deadline(now, args["timeout_s"], now, row[2]),
            try_number=TaskInstance.try_number + 1,
            start_date=now,
            end_date=None,
            runtime_s=0.0,
            deferral_count=1,
        )
    )
    return rowcount(result) == 1


def resume_deferred_tasks_with_event(session: Session, trigger_id: int, payload: Any) -> int:
    """Move the tasks deferred on ``trigger_id`` to ``scheduled``; each resumes with the
    kwargs it gave ``defer(kwargs=...)`` plus ``event=payload``."""
    rows = session.execute(
        select(TaskInstance.id, TaskInstance.next_kwargs).where(
            TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED
        )
    ).all()
    resumed = 0
    for ti_id, stored in rows:
        kwargs = _stored_kwargs(stored, ti_id)
        result = session.execute(
            update(TaskInstance)
            .where(TaskInstance.id == ti_id, TaskInstance.state == TaskState.DEFERRED)
            .values(
                state=TaskState.SCHEDULED,
                next_kwargs=dumps({**kwargs, "event": payload}, where="next_kwargs"),
                trigger_id=None,
                trigger_timeout=None,
            )
        )
        resumed += rowcount(result)
    return resumed


def _stored_kwargs(stored: str | None, ti_id: int) -> dict[str, Any]:
    if not stored:
        return {}
    try:
        value = loads(stored)
    except SerializationError as exc:
        logger.warning(
            "Task instance %s has unreadable defer kwargs (%s); resuming with the event only",
            ti_id,
            exc,
            extra={"action": "next_kwargs_unreadable", "ti_id": ti_id},
        )
        return {}
    return dict(value) if isinstance(value, dict) else {}


def load_start_triggers(session: Session) -> dict[tuple[str, str], str]:
    """(dag_id, task_id) -> encrypted start trigger, for tasks that have one."""
    rows = session.execute(
        select(DagTask.dag_id, DagTask.task_id, DagTask.start_trigger).where(
            DagTask.start_trigger.is_not(None)
        )
    )
    return {(str(d), str(t)): str(token) for d, t, token in rows}
