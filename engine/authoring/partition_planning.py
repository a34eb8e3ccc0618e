"""Which runs a DAG on a ``PartitionedAssetTimetable`` makes from its queued asset events:
the scheduler's decision, as a pure function (``plan_partitioned_runs``).

Theory of operation. Each queued event's partition key goes through its asset's mapper to
one or more downstream keys (a fan-out gives several); an event without a key, of an asset
outside the condition, or whose key the mapper refuses is *refused*, with the reason. Per
downstream key K, an asset is *present* when some event of it maps to K (a rollup asset:
when the upstream keys that arrived for K satisfy its wait policy). K *runs* when the DAG's
asset condition (``&``, ``|``) holds over the present assets; the run consumes every event
mapped to K. Otherwise K *waits*, naming what is missing: the assets the condition still
needs and, for a rollup asset, its missing upstream keys as ``asset[key]``. An event can
map to several keys (fan-out): it then belongs to each of their runs and waits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.authoring.partition_mappers import PartitionKeyError, downstream_keys
from engine.authoring.partition_rollups import RollupMapper

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.partition_timetables import PartitionedAssetTimetable


@dataclass(frozen=True, slots=True)
class QueuedPartitionEvent:
    """An asset event queued for the DAG: its id, asset name and partition key."""

    event_id: int
    asset: str
    partition_key: str | None


@dataclass(frozen=True, slots=True)
class PartitionRun:
    """A run to create for ``partition_key``, consuming the events ``event_ids``."""

    partition_key: str
    event_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PartitionWait:
    """A downstream key not ready yet: ``missing`` names the assets the condition still
    needs and a rollup's missing upstream keys (``"hourly[2026-03-10T07:00:00]"``);
    ``event_ids`` are the queued events mapped to it (they stay queued)."""

    partition_key: str
    missing: tuple[str, ...]
    event_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """An event the DAG cannot use (no key, a key its mapper refuses), and why."""

    event_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """What to do with the queued events: the runs to create, the keys still waiting, the
    events to drop for this DAG. Keys come in sorted order."""

    runs: tuple[PartitionRun, ...]
    waiting: tuple[PartitionWait, ...]
    refused: tuple[RefusedEvent, ...]


@dataclass
class _Key:
    """What arrived for one downstream key: upstream keys by asset, event ids."""

    arrived: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    event_ids: set[int] = field(default_factory=set)


def _map_event(
    timetable: PartitionedAssetTimetable, event: QueuedPartitionEvent, known: frozenset[str]
) -> tuple[str, ...] | str:
    """The downstream keys of ``event``, or the reason it is refused."""
    where = f"event {event.event_id} of asset {event.asset!r}"
    if event.asset not in known:
        return f"{where}: the asset is not in the DAG's partitioned schedule"
    if event.partition_key is None:
        return (
            f"{where} has no partition key; a DAG on a PartitionedAssetTimetable runs per "
            "partition key"
        )
    try:
        return downstream_keys(timetable.mapper_for(event.asset), event.partition_key)
    except PartitionKeyError as exc:
        return f"{where}: {exc}"


def _present(
    timetable: PartitionedAssetTimetable, key: str, entry: _Key
) -> tuple[set[str], list[str]]:
    """The assets present for ``key``, and the missing upstream keys of its rollup assets."""
    present: set[str] = set()
    missing: list[str] = []
    for asset, upstream in entry.arrived.items():
        mapper = timetable.mapper_for(asset)
        arrived = frozenset(upstream)
        if not isinstance(mapper, RollupMapper) or mapper.is_satisfied(key, arrived):
            present.add(asset)
        else:
            expected = mapper.expected_upstream_keys(key)
            missing.extend(f"{asset}[{k}]" for k in sorted(expected - arrived))
    return present, missing


def plan_partitioned_runs(
    timetable: PartitionedAssetTimetable, queued: Sequence[QueuedPartitionEvent]
) -> PartitionPlan:
    """The runs, waits and refusals for the events queued for a partitioned DAG (see the
    module doc)."""
    condition = timetable.asset_condition
    known = frozenset(condition.asset_names())
    by_key: dict[str, _Key] = defaultdict(_Key)
    refused: list[RefusedEvent] = []
    for event in queued:
        mapped = _map_event(timetable, event, known)
        if isinstance(mapped, str):
            refused.append(RefusedEvent(event.event_id, mapped))
            continue
        for key in mapped:
            by_key[key].arrived[event.asset].add(event.partition_key or "")
            by_key[key].event_ids.add(event.event_id)
    runs: list[PartitionRun] = []
    waiting: list[PartitionWait] = []
    for key in sorted(by_key):
        entry = by_key[key]
        present, missing_keys = _present(timetable, key, entry)
        event_ids = tuple(sorted(entry.event_ids))
        if condition.evaluate(present):
            runs.append(PartitionRun(key, event_ids))
            continue
        absent = [name for name in condition.asset_names() if name not in entry.arrived]
        waiting.append(PartitionWait(key, (*absent, *missing_keys), event_ids))
    return PartitionPlan(tuple(runs), tuple(waiting), tuple(refused))
