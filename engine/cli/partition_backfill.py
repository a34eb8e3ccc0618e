"""``sluice dags backfill DAG --partitions K1,K2``: the keys a partition backfill runs.

A DAG on a ``CronPartitionTimetable`` or ``PartitionedAtRuntime`` schedule runs per partition
key; its backfill may name the keys instead of a date range: one run per key, exactly once
(``engine.scheduler.backfills.add_partition_backfill_runs``). A key of a
``CronPartitionTimetable`` must be one its ``key_format`` writes (its run may start at its
partition date); a ``PartitionedAtRuntime`` key is any string of at most 250 characters.

``engine.cli.backfill`` calls it; nothing here writes.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from engine.authoring.partition_timetables import CronPartitionTimetable, PartitionedAtRuntime
from engine.authoring.timetables import TimeRestriction
from engine.scheduler.backfills import PartitionTarget
from triggers.base import check_partition_key

if TYPE_CHECKING:
    from engine.authoring.timetables import Timetable


class PartitionKeysError(ValueError):
    """The keys given to ``--partitions`` cannot be backfilled for this DAG."""


def partition_targets(
    dag_id: str, timetable: Timetable, text: str, *, now: datetime
) -> list[PartitionTarget]:
    """The keys of ``--partitions`` (comma-separated, each once, in the given order) with
    the time each key's run may start; ``PartitionKeysError`` names what is wrong."""
    if not isinstance(timetable, CronPartitionTimetable | PartitionedAtRuntime):
        raise PartitionKeysError(
            f"DAG {dag_id!r} is not partitioned by time or at run time "
            f"({timetable.summary}): --partitions needs a CronPartitionTimetable or "
            "PartitionedAtRuntime schedule; use --from/--to for its logical dates"
        )
    keys = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not keys:
        raise PartitionKeysError(f"--partitions {text!r} names no key")
    targets: list[PartitionTarget] = []
    for key in keys:
        try:
            check_partition_key(key, "--partitions")
        except ValueError as exc:
            raise PartitionKeysError(str(exc)) from exc
        at = now
        if isinstance(timetable, CronPartitionTimetable):
            at = _partition_date(dag_id, timetable, key)
        targets.append(PartitionTarget(key, at))
    return targets


def _partition_date(dag_id: str, timetable: CronPartitionTimetable, key: str) -> datetime:
    """The partition date ``key`` names on the timetable's wall clock; a key its
    ``key_format`` does not write, or of a moment that is not a tick of its cron, is
    refused."""
    try:
        moment: datetime | None = datetime.strptime(key, timetable.key_format).replace(
            tzinfo=timetable.zone
        )
    except ValueError:
        moment = None
    if moment is not None and timetable.key_of(moment) == key and _is_tick(timetable, moment):
        return moment
    example = timetable.key_of(datetime(2026, 3, 10, tzinfo=timetable.zone))
    raise PartitionKeysError(
        f"--partitions: {key!r} is not a partition key of DAG {dag_id!r}: its "
        f"CronPartitionTimetable ({timetable.summary}) writes the key of each tick as "
        f"{timetable.key_format!r}, e.g. {example!r}"
    )


def _is_tick(timetable: CronPartitionTimetable, moment: datetime) -> bool:
    everything = TimeRestriction(earliest=None, latest=None, catchup=True)
    return bool(timetable.runs_between(moment, moment, restriction=everything))
