"""What a backfill does with each of its logical dates (or, ``--partitions``, each of its
partition keys; Airflow 3's ``--reprocess``), and the transaction that does it for one
batch (``sluice dags backfill`` hands the dates over in batches, so a killed command leaves
whole batches behind), on the statements of ``engine.db.queries.backfills`` and ``runs``.

A partitioned DAG gets one run per key: a date whose key already has a run, or a key given
to ``--partitions`` that has one, is that key's run (and ``reprocess`` decides about it).

A date without a run gets one (``create``). For a date that already has a run, the
backfill's ``reprocess`` decides (``decide``):

- ``none``: leave every existing run alone;
- ``failed``: queue failed runs again;
- ``completed``: queue failed and successful runs again.

Queued and running runs are never touched, and neither is a run this backfill already made
(or re-ran): running the same command again resumes without starting finished dates
again. A re-queued run joins the backfill, so it counts against the backfill's
``max_active_runs`` (``runs.start_queued_runs``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypedDict

from engine.db.queries import backfills as backfills_sql
from engine.db.queries import runs
from engine.db.queries.backfills import REPROCESS_COMPLETED, REPROCESS_FAILED
from engine.scheduler.time_runs import create_run_at
from engine.states import DagRunState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.authoring.timetables import DagRunInfo, Timetable
    from engine.db.queries.backfills import ExistingRun


#: Logical dates per transaction of ``sluice dags backfill`` (and per read of a dry run).
BACKFILL_BATCH_SIZE: Final = 100

#: The longest run id ``dag_run.run_id`` holds.
RUN_ID_MAX_LENGTH: Final = 250

#: What a backfill does with one logical date.
CREATE: Final = "create"
REPROCESS: Final = "reprocess"
SKIP: Final = "skip"


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


def _action(existing: ExistingRun | None, backfill_id: int, reprocess: str) -> str:
    """``decide``, except that a run this backfill already made (or re-ran) is its own work,
    not one to reprocess: re-running the same command to resume must not start finished
    dates again."""
    if existing is not None and existing.backfill_id == backfill_id:
        return SKIP
    return decide(None if existing is None else existing.state, reprocess)


def add_backfill_runs(
    session: Session,
    backfill_id: int,
    infos: Sequence[DagRunInfo],
    *,
    reprocess: str,
    now: datetime,
    timetable: Timetable | None = None,
) -> dict[str, int]:
    """Create or re-queue the backfill's runs at ``infos`` (one batch, one transaction).

    With the DAG's ``timetable``, each run gets the partition key it gives its tick (a
    ``CronPartitionTimetable``), and a key that already has a run counts as that date's run
    (made by ``--partitions``, say): one run per key. Returns the counts ``created``,
    ``reprocessed`` and ``skipped``. A date whose run another command created meanwhile is
    skipped (the insert does nothing).
    """
    dag_id = backfills_sql.backfill_dag_id(session, backfill_id)
    dates = [info.logical_date for info in infos]
    keys = {
        info.logical_date: None if timetable is None else timetable.partition_key_for(info)
        for info in infos
    }
    existing = backfills_sql.existing_runs(session, dag_id, dates, lock=True)
    by_key = backfills_sql.existing_runs_by_key(
        session, dag_id, [k for k in keys.values() if k is not None], lock=True
    )
    counts = {"created": 0, "reprocessed": 0, "skipped": 0}
    for info in sorted(infos, key=lambda i: i.logical_date):
        key = keys[info.logical_date]
        found = existing.get(info.logical_date) or (None if key is None else by_key.get(key))
        action = _action(found, backfill_id, reprocess)
        if action == CREATE:
            created = create_run_at(
                session,
                dag_id,
                info,
                run_type=runs.BACKFILL,
                now=now,
                backfill_id=backfill_id,
                partition_key=key,
            )
            counts["skipped" if created is None else "created"] += 1
        else:
            _reprocess_or_skip(session, action, found, backfill_id, now, counts)
    return counts


def _reprocess_or_skip(
    session: Session,
    action: str,
    found: ExistingRun | None,
    backfill_id: int,
    now: datetime,
    counts: dict[str, int],
) -> None:
    if action == REPROCESS and found is not None:
        runs.rerun_run(session, found.pk, now=now, backfill_id=backfill_id)
        counts["reprocessed"] += 1
    else:
        counts["skipped"] += 1


@dataclass(frozen=True, slots=True)
class PartitionTarget:
    """A key a ``PartitionedAtRuntime`` backfill runs, and when its run may start. (A
    ``CronPartitionTimetable`` key's run is its tick's time run: ``add_backfill_runs``.)"""

    partition_key: str
    run_after: datetime


def partition_run_id(partition_key: str) -> str:
    """The run id of a partition backfill's run of ``partition_key``: one per key, so two
    commands racing for it insert one run (a key too long for the column: its digest)."""
    run_id = f"{runs.BACKFILL}__{partition_key}"
    if len(run_id) <= RUN_ID_MAX_LENGTH:
        return run_id
    return f"{runs.BACKFILL}__sha256:{hashlib.sha256(partition_key.encode()).hexdigest()}"


def add_partition_backfill_runs(
    session: Session,
    backfill_id: int,
    targets: Sequence[PartitionTarget],
    *,
    reprocess: str,
    now: datetime,
) -> dict[str, int]:
    """Create or re-queue the runs of a backfill of keys without dates (``PartitionedAtRuntime``)
    for ``targets`` (one batch, one transaction): one run per key, with no logical date,
    whatever made the key's existing run (a manual run, an earlier backfill). Counts as
    ``add_backfill_runs``."""
    dag_id = backfills_sql.backfill_dag_id(session, backfill_id)
    backfills_sql.lock_dag(session, dag_id)
    keys = [target.partition_key for target in targets]
    existing = backfills_sql.existing_runs_by_key(session, dag_id, keys, lock=True)
    counts = {"created": 0, "reprocessed": 0, "skipped": 0}
    for target in targets:
        found = existing.get(target.partition_key)
        action = _action(found, backfill_id, reprocess)
        if action == CREATE:
            created = runs.create_run(
                session,
                dag_id,
                run_type=runs.BACKFILL,
                now=now,
                run_after=target.run_after,
                backfill_id=backfill_id,
                partition_key=target.partition_key,
                run_id=partition_run_id(target.partition_key),
            )
            counts["skipped" if created is None else "created"] += 1
        else:
            _reprocess_or_skip(session, action, found, backfill_id, now, counts)
    return counts


class PlannedKey(TypedDict):
    """What a partition backfill would do with one key (``--dry-run``)."""

    partition_key: str
    run_after: str
    action: str  # CREATE, REPROCESS or SKIP
    existing_state: str | None  # of the key's run (None: no run)


def partition_backfill_plan(
    session: Session, dag_id: str, targets: Sequence[PartitionTarget], *, reprocess: str
) -> list[PlannedKey]:
    """What ``add_partition_backfill_runs`` would do with each key; writes nothing."""
    keys = [target.partition_key for target in targets]
    existing = backfills_sql.existing_runs_by_key(session, dag_id, keys, lock=False)
    plan: list[PlannedKey] = []
    for target in targets:
        found = existing.get(target.partition_key)
        state = None if found is None else found.state
        plan.append(
            {
                "partition_key": target.partition_key,
                "run_after": target.run_after.isoformat(),
                "action": decide(state, reprocess),
                "existing_state": state,
            }
        )
    return plan


class PlannedDate(TypedDict):
    """What a backfill would do at one date (``sluice dags backfill --dry-run``)."""

    logical_date: str
    run_after: str
    action: str  # CREATE, REPROCESS or SKIP
    existing_state: str | None  # of the date's run (None: no run)


def backfill_plan(
    session: Session, dag_id: str, infos: Sequence[DagRunInfo], *, reprocess: str
) -> list[PlannedDate]:
    """What ``add_backfill_runs`` would do at each date (``--dry-run``); writes nothing."""
    plan: list[PlannedDate] = []
    for start in range(0, len(infos), BACKFILL_BATCH_SIZE):
        batch = infos[start : start + BACKFILL_BATCH_SIZE]
        dates = [info.logical_date for info in batch]
        existing = backfills_sql.existing_runs(session, dag_id, dates, lock=False)
        for info in batch:
            found = existing.get(info.logical_date)
            state = None if found is None else found.state
            plan.append(
                {
                    "logical_date": info.logical_date.isoformat(),
                    "run_after": info.run_after.isoformat(),
                    "action": decide(state, reprocess),
                    "existing_state": state,
                }
            )
    return plan
