"""``sluice dags backfill DAG --partitions K1,K2``: the keys a partition backfill runs.

A DAG on a ``CronPartitionTimetable`` or ``PartitionedAtRuntime`` schedule runs per partition
key; its backfill may name the keys instead of a date range: one run per key, exactly once.
A key of a ``CronPartitionTimetable`` must be one its ``key_format`` writes for a tick: its
run is that tick's time run (``run_for_key``), as a scheduled run or a ``--from/--to``
backfill would make it (``engine.scheduler.backfills.add_backfill_runs``); a
``PartitionedAtRuntime`` key is any string of at most 250 characters, and its run has no
logical date (``add_partition_backfill_runs``).

``engine.cli.backfill`` calls it; nothing here writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.authoring.partition_mappers import PartitionKeyError
from engine.authoring.partition_timetables import CronPartitionTimetable, PartitionedAtRuntime
from engine.scheduler.backfills import PartitionTarget
from triggers.base import check_partition_key

if TYPE_CHECKING:
    from datetime import datetime

    from engine.authoring.timetables import DagRunInfo, Timetable


class PartitionKeysError(ValueError):
    """The keys given to ``--partitions`` cannot be backfilled for this DAG."""


def partition_targets(
    dag_id: str, timetable: Timetable, text: str, *, now: datetime
) -> list[DagRunInfo] | list[PartitionTarget]:
    """The runs of the keys of ``--partitions`` (comma-separated, each once, in the given
    order): a ``CronPartitionTimetable``'s time run of each key (its logical date, data
    interval and start, as a scheduled run of that key has), or a ``PartitionedAtRuntime``
    key that may start ``now``. ``PartitionKeysError`` names what is wrong."""
    if not isinstance(timetable, CronPartitionTimetable | PartitionedAtRuntime):
        raise PartitionKeysError(
            f"DAG {dag_id!r} is not partitioned by time or at run time "
            f"({timetable.summary}): --partitions needs a CronPartitionTimetable or "
            "PartitionedAtRuntime schedule; use --from/--to for its logical dates"
        )
    keys = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not keys:
        raise PartitionKeysError(f"--partitions {text!r} names no key")
    for key in keys:
        try:
            check_partition_key(key, "--partitions")
        except ValueError as exc:
            raise PartitionKeysError(str(exc)) from exc
    if isinstance(timetable, PartitionedAtRuntime):
        return [PartitionTarget(key, now) for key in keys]
    try:
        return [timetable.run_for_key(key) for key in keys]
    except PartitionKeyError as exc:
        raise PartitionKeysError(f"--partitions: DAG {dag_id!r}: {exc}") from exc
