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
from triggers.base import check_partition_key

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from sqlalchemy.orm import Session


class TriggeredRun(TypedDict):
    dag_id: str
    run_id: str
    logical_date: str
    partition_key: str | None


def trigger_dag(
    session: Session,
    dag_id: str,
    *,
    conf: Mapping[str, Any] | None,
    logical_date: datetime | None,
    now: datetime,
    date_option: str = "--logical-date",
    partition_key: str | None = None,
) -> TriggeredRun:
    """Create a manual run of ``dag_id`` at ``logical_date`` (default: ``now``); returns
    {dag_id, run_id, logical_date}. Its data interval is the one the DAG's time schedule
    gives that date (none: the date itself); a future date makes the run wait for it.
    ``partition_key``: the slice the run processes; any DAG's manual run may carry one (as
    in Airflow, where a DAG with ``schedule=None`` is triggered with a region code, say),
    and its tasks' outlet events carry it.

    Raises ``NotFoundError`` for an unknown DAG, ``InvalidStateError`` when the DAG already
    has a run at that logical date (``date_option`` names how to pick another), and
    ``OperatorActionError`` when its stored schedule cannot be read, ``conf`` gives a param
    a value its ``Param`` refuses (as Airflow, which creates no run then), or the partition
    key is not a valid key.
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
    timetable = None
    if sched.timetable is not None:
        try:
            timetable = timetable_from_json(sched.timetable)
        except ValueError as exc:
            raise OperatorActionError(
                f"the stored schedule of DAG {dag_id!r} cannot be read ({exc}); let the DAG "
                "processor parse the DAG file again"
            ) from exc
        interval = timetable.infer_manual_data_interval(run_after=logical)
    if partition_key is not None:
        _check_key(partition_key)
    pk = runs_sql.create_run(
        session,
        dag_id,
        run_type=runs_sql.MANUAL,
        now=now,
        conf=dict(conf) if conf is not None else None,
        logical_date=logical,
        data_interval=(interval.start, interval.end),
        run_after=max(now, logical),
        partition_key=partition_key,
    )
    if pk is None:
        raise InvalidStateError(
            f"DAG {dag_id!r} already has a run with logical date {logical.isoformat()}; "
            f"`sluice runs list` shows it, {date_option} picks another"
        )
    run_id = runs_sql.run_id_of(session, pk)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "logical_date": logical.isoformat(),
        "partition_key": partition_key,
    }


def _check_key(partition_key: str) -> None:
    try:
        check_partition_key(partition_key, "partition_key")
    except ValueError as exc:
        raise OperatorActionError(str(exc)) from exc
