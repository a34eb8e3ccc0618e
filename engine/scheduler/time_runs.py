"""A time-scheduled DAG's due run: the scheduler's decision, on the statements of
``engine.db.queries.runs``.

The DAG's next run is the one the scheduler stored on its row (``next_dagrun*``) for a
periodic timetable; else (not computed yet, a one-off timetable) the one its timetable
gives now. A run that is due is created unless ``max_active_runs`` (or the timetable's own
limit) runs are active; then the run after it is stored, or the held one is kept without a
time (shown, not polled: when one of the DAG's runs ends it is computed afresh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import DagRunInfo, DataInterval, TimeRestriction
from engine.db.queries import runs, time_schedules

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session


def create_time_run(session: Session, dag_id: str, *, now: datetime) -> tuple[int, datetime] | None:
    """Create the DAG's due time run and store the one after it; (run, logical date).

    Raises ``ValueError`` when the DAG's stored timetable cannot be read."""
    dag = time_schedules.lock_time_dag(session, dag_id, now=now)
    if dag is None:
        return None
    timetable = timetable_from_json(dag.timetable)
    restriction = TimeRestriction(dag.start_date, dag.end_date, dag.catchup)
    last = time_schedules.last_automated_interval(session, dag_id)
    info: DagRunInfo | None
    if not dag.next_dagrun_computed or not timetable.periodic:
        info = timetable.next_dagrun_info(
            last_automated_data_interval=None if last is None else DataInterval(*last),
            restriction=restriction,
            now=now,
        )
    elif dag.next_dagrun is not None and dag.next_data_interval is not None:
        info = _stored_info(dag)
    else:
        info = None
    if info is None or info.run_after > now:
        store_next(session, dag_id, info)
        return None
    limit = dag.max_active_runs
    if timetable.active_runs_limit is not None:
        limit = min(limit, timetable.active_runs_limit)
    if runs.count_active_runs(session, dag_id) >= limit:
        # Not due while held: no polling. When one of its runs ends, the next run is
        # computed afresh (with catchup off: the latest tick then, not this stale one).
        store_next(session, dag_id, info, held=True)
        return None
    run_pk = create_run_at(
        session,
        dag_id,
        info,
        run_type=runs.SCHEDULED,
        now=now,
        partition_key=timetable.partition_key_for(info),
    )
    following = timetable.next_dagrun_info(
        last_automated_data_interval=info.data_interval, restriction=restriction, now=now
    )
    store_next(session, dag_id, following)
    return None if run_pk is None else (run_pk, info.logical_date)


def create_run_at(
    session: Session,
    dag_id: str,
    info: DagRunInfo,
    *,
    run_type: str,
    now: datetime,
    backfill_id: int | None = None,
    partition_key: str | None = None,
) -> int | None:
    """Create the DAG's run at a tick of its timetable (``info``: logical date, data
    interval, earliest start), with the partition key the timetable gives that tick (a
    ``CronPartitionTimetable``'s; None for the others); None when the DAG has a run at that
    logical date."""
    return runs.create_run(
        session,
        dag_id,
        run_type=run_type,
        now=now,
        logical_date=info.logical_date,
        data_interval=(info.data_interval.start, info.data_interval.end),
        run_after=info.run_after,
        backfill_id=backfill_id,
        partition_key=partition_key,
    )


def _stored_info(dag: time_schedules.TimeDag) -> DagRunInfo:
    assert dag.next_dagrun is not None and dag.next_data_interval is not None
    return DagRunInfo(
        logical_date=dag.next_dagrun,
        data_interval=DataInterval(*dag.next_data_interval),
        run_after=dag.next_dagrun_create_after or dag.next_dagrun,
    )


def store_next(
    session: Session, dag_id: str, info: DagRunInfo | None, *, held: bool = False
) -> None:
    """Store the DAG's next time run; ``held`` (max_active_runs reached): shown, not due."""
    time_schedules.set_next_dagrun(
        session,
        dag_id,
        logical_date=None if info is None else info.logical_date,
        data_interval=None if info is None else (info.data_interval.start, info.data_interval.end),
        run_after=None if info is None or held else info.run_after,
    )
