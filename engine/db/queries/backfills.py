"""SQL of backfills (``sluice dags backfill``): the backfill row, its runs, and when it ends;
plus the schedule columns of DAGs as the backfill, ``dags show`` and ``dags list`` read them.

Theory of operation. A backfill stands for the runs of one DAG between two logical dates.
The CLI computes those dates from the DAG's timetable and hands them over in batches, each
in its own transaction (``add_backfill_runs``), so a killed command leaves whole batches
behind. Running the same command again resumes the same backfill
(``create_or_resume_backfill``) and skips every date that already has a run: the unique
(dag_id, logical_date) of ``dag_run`` makes a repeated or concurrent insert do nothing.

For a date that already has a run, ``reprocess`` decides (Airflow 3's ``--reprocess``):

- ``none``: leave every existing run alone;
- ``failed``: queue failed runs again;
- ``completed``: queue failed and successful runs again.

Queued and running runs are never touched. A re-queued run joins the backfill, so it counts
against the backfill's ``max_active_runs`` (``runs.start_queued_runs``).

A backfill is complete once it has runs and none of them is queued or running
(``complete_finished_backfills``, each scheduler loop). One without runs (every date was
skipped) is completed by the command itself (``complete_backfill_if_done``): the scheduler
must not complete a backfill whose first batch is still being written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, exists, insert, select, update

from engine.db.database import is_postgres
from engine.db.models import Backfill, Dag, DagRun
from engine.db.queries import runs
from engine.states import DagRunState

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.authoring.timetables import DagRunInfo


#: Runs created per transaction by ``sluice dags backfill``.
BACKFILL_BATCH_SIZE: Final = 100

REPROCESS_NONE: Final = "none"
REPROCESS_FAILED: Final = "failed"
REPROCESS_COMPLETED: Final = "completed"
REPROCESS_BEHAVIORS: Final = (REPROCESS_NONE, REPROCESS_FAILED, REPROCESS_COMPLETED)

#: What a backfill does with one logical date (``backfill_plan``'s ``action``).
CREATE: Final = "create"
REPROCESS: Final = "reprocess"
SKIP: Final = "skip"

_ACTIVE: Final = (DagRunState.QUEUED, DagRunState.RUNNING)


class BackfillConflictError(ValueError):
    """The DAG has an unfinished backfill of another date range."""


@dataclass(frozen=True, slots=True)
class BackfillRow:
    id: int
    dag_id: str
    from_date: datetime
    to_date: datetime
    reprocess: str
    max_active_runs: int
    created_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class DagSchedule:
    """A DAG's schedule columns: what it runs on, its time bounds and its next time run."""

    dag_id: str
    is_paused: bool
    is_active: bool
    timetable: Any  # serialized timetable (engine.authoring.timetables) or None
    timetable_summary: str | None
    asset_condition: Any  # the asset condition JSON or None
    timezone: str
    start_date: datetime | None
    end_date: datetime | None
    catchup: bool
    max_active_runs: int
    tags: list[str]
    next_dagrun_computed: bool
    next_dagrun: datetime | None
    next_dagrun_data_interval: tuple[datetime, datetime] | None
    next_dagrun_create_after: datetime | None


def dag_schedules(session: Session, dag_ids: Iterable[str] | None = None) -> dict[str, DagSchedule]:
    """dag_id -> its schedule columns, for the given DAGs (all when None)."""
    stmt = select(Dag).order_by(Dag.dag_id)
    if dag_ids is not None:
        stmt = stmt.where(Dag.dag_id.in_(list(dag_ids)))
    return {d.dag_id: _dag_schedule(d) for d in session.execute(stmt).scalars()}


def _dag_schedule(dag: Dag) -> DagSchedule:
    interval_start, interval_end = (
        dag.next_dagrun_data_interval_start,
        dag.next_dagrun_data_interval_end,
    )
    return DagSchedule(
        dag_id=dag.dag_id,
        is_paused=bool(dag.is_paused),
        is_active=bool(dag.is_active),
        timetable=dag.timetable,
        timetable_summary=dag.timetable_summary,
        asset_condition=dag.schedule,
        timezone=dag.timezone or "UTC",
        start_date=dag.start_date,
        end_date=dag.end_date,
        catchup=bool(dag.catchup),
        max_active_runs=int(dag.max_active_runs),
        tags=[str(t) for t in dag.tags or []],
        next_dagrun_computed=bool(dag.next_dagrun_computed),
        next_dagrun=dag.next_dagrun,
        next_dagrun_data_interval=(
            None
            if interval_start is None or interval_end is None
            else (interval_start, interval_end)
        ),
        next_dagrun_create_after=dag.next_dagrun_create_after,
    )


def unfinished_backfill(session: Session, dag_id: str) -> BackfillRow | None:
    """The DAG's backfill that is not complete yet (the latest, should there be several)."""
    row = session.execute(
        select(Backfill)
        .where(Backfill.dag_id == dag_id, Backfill.completed_at.is_(None))
        .order_by(Backfill.id.desc())
        .limit(1)
    ).scalar()
    return None if row is None else _backfill_row(row)


def get_backfill(session: Session, backfill_id: int) -> BackfillRow | None:
    row = session.get(Backfill, backfill_id)
    return None if row is None else _backfill_row(row)


def _backfill_row(row: Backfill) -> BackfillRow:
    return BackfillRow(
        id=row.id,
        dag_id=row.dag_id,
        from_date=row.from_date,
        to_date=row.to_date,
        reprocess=row.reprocess,
        max_active_runs=row.max_active_runs,
        created_at=row.created_at,
        completed_at=row.completed_at,
    )


def create_or_resume_backfill(
    session: Session,
    dag_id: str,
    *,
    from_date: datetime,
    to_date: datetime,
    reprocess: str,
    max_active_runs: int,
    created_by: str | None,
    now: datetime,
) -> int:
    """The id of the DAG's unfinished backfill of this range (resumed, with this
    ``reprocess`` and ``max_active_runs``), or of a new one.

    Raises ``BackfillConflictError`` when the DAG has an unfinished backfill of another
    range. On PostgreSQL the DAG's row is locked first, so two commands racing for one DAG
    create one backfill.
    """
    if reprocess not in REPROCESS_BEHAVIORS:
        raise ValueError(f"reprocess must be one of {REPROCESS_BEHAVIORS}, got {reprocess!r}")
    if is_postgres(session):
        session.execute(select(Dag.dag_id).where(Dag.dag_id == dag_id).with_for_update())
    current = unfinished_backfill(session, dag_id)
    if current is not None:
        if (current.from_date, current.to_date) != (from_date, to_date):
            raise BackfillConflictError(
                f"DAG {dag_id!r} has an unfinished backfill (id {current.id}) from "
                f"{current.from_date.isoformat()} to {current.to_date.isoformat()}: wait until "
                "its runs have finished, or run the command again with that range to resume it"
            )
        session.execute(
            update(Backfill)
            .where(Backfill.id == current.id)
            .values(reprocess=reprocess, max_active_runs=max_active_runs)
        )
        return current.id
    return int(
        session.execute(
            insert(Backfill)
            .values(
                dag_id=dag_id,
                from_date=from_date,
                to_date=to_date,
                reprocess=reprocess,
                max_active_runs=max_active_runs,
                created_by=created_by,
                created_at=now,
            )
            .returning(Backfill.id)
        ).scalar_one()
    )


def decide(existing_state: str | None, reprocess: str) -> str:
    """What a backfill does with a logical date whose run is in ``existing_state`` (None: no
    run): ``CREATE``, ``REPROCESS`` or ``SKIP``."""
    if existing_state is None:
        return CREATE
    if existing_state == DagRunState.FAILED and reprocess in (
        REPROCESS_FAILED,
        REPROCESS_COMPLETED,
    ):
        return REPROCESS
    if existing_state == DagRunState.SUCCESS and reprocess == REPROCESS_COMPLETED:
        return REPROCESS
    return SKIP


def _existing_runs(
    session: Session, dag_id: str, infos: Sequence[DagRunInfo], *, lock: bool
) -> dict[datetime, tuple[int, str, int | None]]:
    """logical date -> (run pk, state, backfill id) of the DAG's runs at the given dates."""
    if not infos:
        return {}
    stmt = select(DagRun.id, DagRun.logical_date, DagRun.state, DagRun.backfill_id).where(
        DagRun.dag_id == dag_id, DagRun.logical_date.in_([info.logical_date for info in infos])
    )
    if lock and is_postgres(session):
        stmt = stmt.with_for_update()
    rows = session.execute(stmt).all()
    return {
        date: (int(pk), str(state), None if backfill is None else int(backfill))
        for pk, date, state, backfill in rows
        if date is not None
    }


def add_backfill_runs(
    session: Session,
    backfill_id: int,
    infos: Sequence[DagRunInfo],
    *,
    reprocess: str,
    now: datetime,
) -> dict[str, int]:
    """Create or re-queue the backfill's runs at ``infos`` (one batch, one transaction).

    Returns the counts ``created``, ``reprocessed`` and ``skipped``. A date whose run another
    command created meanwhile is skipped (the insert does nothing).
    """
    dag_id = session.execute(select(Backfill.dag_id).where(Backfill.id == backfill_id)).scalar_one()
    existing = _existing_runs(session, dag_id, infos, lock=True)
    counts = {"created": 0, "reprocessed": 0, "skipped": 0}
    for info in sorted(infos, key=lambda i: i.logical_date):
        pk, state, owner = existing.get(info.logical_date, (None, None, None))
        # A run this backfill already made (or re-ran) is its own work, not one to reprocess:
        # re-running the same command to resume must not start finished dates again.
        action = SKIP if pk is not None and owner == backfill_id else decide(state, reprocess)
        if action == CREATE:
            created = runs.create_run(
                session,
                dag_id,
                run_type=runs.BACKFILL,
                now=now,
                logical_date=info.logical_date,
                data_interval=(info.data_interval.start, info.data_interval.end),
                run_after=info.run_after,
                backfill_id=backfill_id,
            )
            counts["skipped" if created is None else "created"] += 1
        elif action == REPROCESS and pk is not None:
            runs.rerun_run(session, pk, now=now, backfill_id=backfill_id)
            counts["reprocessed"] += 1
        else:
            counts["skipped"] += 1
    return counts


def backfill_plan(
    session: Session, dag_id: str, infos: Sequence[DagRunInfo], *, reprocess: str
) -> list[dict[str, Any]]:
    """What ``add_backfill_runs`` would do at each date (``--dry-run``); writes nothing.

    One dict per date: ``logical_date``, ``run_after`` (ISO strings), ``action`` (create,
    reprocess, skip) and ``existing_state`` (the state of the date's run, or None).
    """
    plan: list[dict[str, Any]] = []
    for start in range(0, len(infos), BACKFILL_BATCH_SIZE):
        batch = infos[start : start + BACKFILL_BATCH_SIZE]
        existing = _existing_runs(session, dag_id, batch, lock=False)
        for info in batch:
            _, state, _ = existing.get(info.logical_date, (None, None, None))
            plan.append(
                {
                    "logical_date": info.logical_date.isoformat(),
                    "run_after": info.run_after.isoformat(),
                    "action": decide(state, reprocess),
                    "existing_state": state,
                }
            )
    return plan


def _has_active_run() -> Any:
    return exists().where(DagRun.backfill_id == Backfill.id, DagRun.state.in_(_ACTIVE))


def complete_finished_backfills(session: Session, *, now: datetime) -> list[int]:
    """Complete the unfinished backfills that have runs, none queued or running; returns
    their ids. (A backfill without runs may still be getting its first batch.)"""
    ids = [
        int(i)
        for i in session.execute(
            select(Backfill.id).where(
                Backfill.completed_at.is_(None),
                exists().where(DagRun.backfill_id == Backfill.id),
                ~_has_active_run(),
            )
        ).scalars()
    ]
    if ids:
        session.execute(
            update(Backfill)
            .where(Backfill.id.in_(ids), Backfill.completed_at.is_(None))
            .values(completed_at=now)
        )
    return ids


def complete_backfill_if_done(session: Session, backfill_id: int, *, now: datetime) -> bool:
    """Complete the backfill if none of its runs is queued or running (also when it has no
    runs: the command that wrote it calls this when it is done); whether it is complete."""
    session.execute(
        update(Backfill)
        .where(
            and_(Backfill.id == backfill_id, Backfill.completed_at.is_(None), ~_has_active_run())
        )
        .values(completed_at=now)
    )
    done = session.execute(select(Backfill.completed_at).where(Backfill.id == backfill_id)).scalar()
    return done is not None
