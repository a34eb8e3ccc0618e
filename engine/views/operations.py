"""What an operator does that is more than one query, written once for the CLI and the REST
API: trigger a manual run of a DAG (its data interval from the DAG's time schedule).

The other actions are single query functions both call directly: pausing
(``queries.dags.set_paused``), emitting an asset event (``queries.assets.emit_asset_event``),
clearing tasks, setting a task's state, cancelling a run (``queries.actions``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from engine.authoring.params import check_run_conf
from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import DataInterval
from engine.db.queries import backfills as backfills_sql
from engine.db.queries import dags as dags_sql
from engine.db.queries import runs as runs_sql
from engine.exceptions import (
    InvalidStateError,
    NotFoundError,
    OperatorActionError,
    ParamValidationError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from sqlalchemy.orm import Session


class TriggeredRun(TypedDict):
    dag_id: str
    run_id: str
    logical_date: str


def trigger_dag(
    session: Session,
    dag_id: str,
    *,
    conf: Mapping[str, Any] | None,
    logical_date: datetime | None,
    now: datetime,
    date_option: str = "--logical-date",
) -> TriggeredRun:
    """Create a manual run of ``dag_id`` at ``logical_date`` (default: ``now``); returns
    {dag_id, run_id, logical_date}. Its data interval is the one the DAG's time schedule
    gives that date (none: the date itself); a future date makes the run wait for it.

    Raises ``NotFoundError`` for an unknown DAG, ``InvalidStateError`` when the DAG already
    has a run at that logical date (``date_option`` names how to pick another), and
    ``OperatorActionError`` when its stored schedule cannot be read or ``conf`` gives a
    param a value its ``Param`` refuses (as Airflow, which creates no run then).
    """
    sched = backfills_sql.dag_schedules(session, [dag_id]).get(dag_id)
    if sched is None:
        raise NotFoundError(f"no DAG {dag_id!r}; see `sluice dags list`")
    try:
        check_run_conf(dags_sql.dag_param_specs(session, dag_id), conf)
    except ParamValidationError as exc:
        raise OperatorActionError(
            f"DAG {dag_id!r}: the run's conf is refused, no run created: {exc}"
        ) from exc
    logical = now if logical_date is None else logical_date
    interval = DataInterval(logical, logical)
    if sched.timetable is not None:
        try:
            timetable = timetable_from_json(sched.timetable)
        except ValueError as exc:
            raise OperatorActionError(
                f"the stored schedule of DAG {dag_id!r} cannot be read ({exc}); let the DAG "
                "processor parse the DAG file again"
            ) from exc
        interval = timetable.infer_manual_data_interval(run_after=logical)
    pk = runs_sql.create_run(
        session,
        dag_id,
        run_type=runs_sql.MANUAL,
        now=now,
        conf=dict(conf) if conf is not None else None,
        logical_date=logical,
        data_interval=(interval.start, interval.end),
        run_after=max(now, logical),
    )
    if pk is None:
        raise InvalidStateError(
            f"DAG {dag_id!r} already has a run with logical date {logical.isoformat()}; "
            f"`sluice runs list` shows it, {date_option} picks another"
        )
    run_id = runs_sql.run_id_of(session, pk)
    return {"dag_id": dag_id, "run_id": run_id, "logical_date": logical.isoformat()}
