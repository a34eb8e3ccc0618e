"""The executor's answers to ``TriggerDagRunOperator``'s requests (``trigger_dag_run``,
``dag_run_state``; the task side is ``engine.authoring.trigger_dagrun``).

``trigger_dag_run`` creates a manual run of the DAG, as ``sluice dags trigger`` does: at the
logical date asked (None: a run without one), its data interval from the DAG's timetable,
with the run id asked (default: a manual run id) and the conf. When the DAG already has a
run with that run id or logical date, the answer says so and nothing is created
(``exists``), or the run is skipped over (``skipped``: ``skip_when_already_exists``) or
cleared so that its tasks run again (``reset``: ``reset_dag_run``), checked in that order
as in Airflow 3.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import DataInterval
from engine.authoring.trigger_dagrun import CREATED, EXISTS, PAUSED, RESET, SKIPPED
from engine.db.queries import actions as actions_sql
from engine.db.queries import backfills as backfills_sql
from engine.db.queries import runs as runs_sql
from engine.db.queries import triggered_runs
from engine.exceptions import NotFoundError, OperatorActionError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def _logical(value: str | None) -> datetime | None:
    if value is None:
        return None
    moment = datetime.fromisoformat(value)
    if moment.utcoffset() is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _interval(timetable: Any, dag_id: str, logical: datetime) -> DataInterval:
    if timetable is None:
        return DataInterval(logical, logical)
    try:
        return timetable_from_json(timetable).infer_manual_data_interval(run_after=logical)
    except ValueError as exc:
        raise OperatorActionError(
            f"the stored schedule of DAG {dag_id!r} cannot be read ({exc}); let the DAG "
            "processor parse the DAG file again"
        ) from exc


def _answer(outcome: str, run_id: str, logical: datetime | None) -> dict[str, Any]:
    shown = None if logical is None else logical.astimezone(UTC).isoformat()
    return {"outcome": outcome, "run_id": run_id, "logical_date": shown}


def trigger_dag_run(
    session: Session,
    *,
    dag_id: str,
    run_id: str | None,
    conf: Any,
    logical_date: str | None,
    reset_dag_run: bool,
    skip_when_already_exists: bool,
    fail_when_dag_is_paused: bool = False,
    now: datetime,
) -> dict[str, Any]:
    """Create (or find, skip or clear) the run; ``{"outcome", "run_id", "logical_date"}``.

    ``NotFoundError`` for a DAG that does not exist (or whose file is gone)."""
    sched = backfills_sql.dag_schedules(session, [dag_id]).get(dag_id)
    if sched is None or not sched.is_active:
        raise NotFoundError(f"DAG {dag_id!r} to trigger does not exist; see `sluice dags list`")
    if conf is not None and not isinstance(conf, dict):
        raise OperatorActionError(f"the conf of a run must be a JSON object, got {conf!r}")
    logical = _logical(logical_date)
    if fail_when_dag_is_paused and sched.is_paused:
        return _answer(PAUSED, run_id or "", logical)
    found = triggered_runs.existing_run(session, dag_id, run_id=run_id, logical_date=logical)
    if found is not None:
        if skip_when_already_exists:
            return _answer(SKIPPED, found.run_id, found.logical_date)
        if not reset_dag_run:
            return _answer(EXISTS, found.run_id, found.logical_date)
        selected = actions_sql.select_task_instances(session, dag_id, run_id=found.run_id)
        actions_sql.clear_task_instances(session, selected, now=now)
        return _answer(RESET, found.run_id, found.logical_date)
    run_after = now if logical is None else max(now, logical)
    interval = _interval(sched.timetable, dag_id, logical or now)
    pk = runs_sql.create_run(
        session,
        dag_id,
        run_type=runs_sql.MANUAL,
        now=now,
        conf=conf,
        logical_date=logical,
        data_interval=(interval.start, interval.end),
        run_after=run_after,
        run_id=run_id,
    )
    if pk is None:  # created by another writer since the read above
        return _answer(EXISTS, run_id or "?", logical)
    return _answer(CREATED, runs_sql.run_id_of(session, pk), logical)


def dag_run_state(session: Session, *, dag_id: str, run_id: str) -> str:
    """The state of the run; ``NotFoundError`` when it does not exist (any more)."""
    state = triggered_runs.run_state(session, dag_id, run_id)
    if state is None:
        raise NotFoundError(f"DAG {dag_id!r} has no run {run_id!r}")
    return state
