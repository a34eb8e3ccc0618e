""" "Why" for a DAG on a ``PartitionedAssetTimetable``: per partition key, what it waits for.

Pure: the DAG's timetable and the events queued for it in, a ``PartitionSchedule`` out. It
asks the scheduler's own plan (``engine.authoring.partition_planning.plan_partitioned_runs``)
and says each ``PartitionWait`` in words: the assets the condition still needs for the key
and, for an asset under a rollup mapper, how many of its window's upstream keys are missing
and which, e.g. ``2026-03-10: waiting for 3 of 24 hourly keys of asset hourly_sales:
2026-03-10T21:00:00, 2026-03-10T22:00:00, 2026-03-10T23:00:00``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from engine.authoring.assets import Asset, AssetAll, AssetAny, AssetNameRef, BaseAsset
from engine.authoring.partition_planning import QueuedPartitionEvent, plan_partitioned_runs
from engine.authoring.partition_rollups import RollupMapper
from engine.authoring.partition_windows import MinimumCount, SegmentWindow

if TYPE_CHECKING:
    from collections.abc import Sequence
    from collections.abc import Set as AbstractSet

    from engine.authoring.partition_planning import PartitionWait
    from engine.authoring.partition_timetables import PartitionedAssetTimetable
    from engine.views.why_records import PartitionSchedule, PartitionWaitEntry, RollupWait

#: Missing upstream keys named in a message (all of them are in ``rollups``).
KEYS_NAMED: Final = 6
#: Waiting partition keys listed (the newest); ``waiting_total`` counts them all.
WAITS_SHOWN: Final = 50
_GRAIN: Final = {"minute": "minute", "hour": "hourly", "day": "daily", "month": "monthly"}


def partition_schedule(
    timetable: PartitionedAssetTimetable,
    queued: Sequence[tuple[int, str, str | None]],
    consumed: AbstractSet[tuple[int, str]] = frozenset(),
) -> PartitionSchedule:
    """What the scheduler's plan makes of the queued events ``(event id, asset, key)``: the
    keys ready to run, the keys waiting (newest first) and why, the events it refuses.
    ``consumed``: (event id, key) pairs a run of that key already consumed (an event a
    fan-out keeps queued for its other keys): such a key is not ready again, as the
    scheduler makes no second run of it."""
    events = [QueuedPartitionEvent(e, asset, key) for e, asset, key in queued]
    plan = plan_partitioned_runs(timetable, events)
    ready = [
        run.partition_key
        for run in plan.runs
        if not any((e, run.partition_key) in consumed for e in run.event_ids)
    ]
    names = timetable.asset_condition.asset_names()
    waiting = sorted(plan.waiting, key=lambda w: w.partition_key, reverse=True)
    return {
        "mappers": {name: repr(timetable.mapper_for(name)) for name in names},
        "queued_events": len(events),
        "ready": ready,
        "waiting": [_wait_entry(timetable, wait) for wait in waiting[:WAITS_SHOWN]],
        "waiting_total": len(waiting),
        "refused": [{"event_id": r.event_id, "reason": r.reason} for r in plan.refused],
    }


def _split(missing: Sequence[str], names: Sequence[str]) -> tuple[list[str], dict[str, set[str]]]:
    """A wait's ``missing`` as (absent assets, asset -> its missing upstream keys): an entry
    is an asset's name, or ``asset[key]`` for a rollup's key (read with the known names, the
    longest first, so that a name holding ``[`` is read right)."""
    absent: list[str] = []
    keys: dict[str, set[str]] = {}
    by_length = sorted(names, key=len, reverse=True)
    for item in missing:
        if item in names:
            absent.append(item)
            continue
        owners = [n for n in by_length if item.startswith(f"{n}[") and item.endswith("]")]
        if owners:
            owner = owners[0]
            keys.setdefault(owner, set()).add(item[len(owner) + 1 : -1])
    return absent, keys


def _wait_entry(timetable: PartitionedAssetTimetable, wait: PartitionWait) -> PartitionWaitEntry:
    names = timetable.asset_condition.asset_names()
    absent, missing_keys = _split(wait.missing, names)
    rollups = [_rollup(timetable, wait.partition_key, a, k) for a, k in missing_keys.items()]
    details = {r["asset"]: _rollup_text(r) for r in rollups}
    present = frozenset(names) - set(absent) - set(details)
    text = _missing_text(timetable.asset_condition, present, details)
    return {
        "partition_key": wait.partition_key,
        "missing_assets": absent,
        "rollups": rollups,
        "events": len(wait.event_ids),
        "message": f"{wait.partition_key}: waiting for {text or ', '.join(wait.missing)}",
    }


def _rollup(
    timetable: PartitionedAssetTimetable, key: str, asset: str, missing: set[str]
) -> RollupWait:
    mapper = timetable.mapper_for(asset)
    assert isinstance(mapper, RollupMapper), mapper  # only a rollup names missing keys
    expected = mapper.expected_upstream_keys(key)
    policy = mapper.wait_policy
    return {
        "asset": asset,
        "grain": _grain(mapper),
        "expected": len(expected),
        "arrived": len(expected - missing),
        "missing_keys": sorted(missing),
        "wait_policy": repr(policy),
        "needed": policy.n if isinstance(policy, MinimumCount) else None,
    }


def _grain(mapper: RollupMapper) -> str:
    """What one upstream key of the window is: ``hourly`` for a DayWindow's hours."""
    window = mapper.window
    if isinstance(window, SegmentWindow):
        return "segment"
    member = window.default_fan_out_period or ("minute" if window.period == "hour" else "")
    return _GRAIN.get(member, "upstream")


def _rollup_text(rollup: RollupWait) -> str:
    """``3 of 24 hourly keys of asset hourly_sales: k1, k2, k3``."""
    missing = rollup["missing_keys"]
    named = ", ".join(missing[:KEYS_NAMED])
    if len(missing) > KEYS_NAMED:
        named += f" and {len(missing) - KEYS_NAMED} more"
    text = (
        f"{len(missing)} of {rollup['expected']} {rollup['grain']} keys of asset "
        f"{rollup['asset']}: {named}"
    )
    if rollup["needed"] is not None:
        text += f" ({rollup['wait_policy']}; {rollup['arrived']} arrived)"
    return text


def _missing_text(condition: BaseAsset, present: frozenset[str], details: dict[str, str]) -> str:
    """What the condition still lacks for the key, in words ("asset b", "3 of 24 hourly
    keys of asset a: ..." for a rollup, "asset b or asset c")."""
    if condition.evaluate(present):
        return ""
    if isinstance(condition, Asset | AssetNameRef):
        return details.get(condition.name, f"an event of asset {condition.name} for this key")
    if not isinstance(condition, AssetAll | AssetAny):
        return str(condition)
    parts = [text for item in condition.objects if (text := _missing_text(item, present, details))]
    if len(parts) == 1:
        return parts[0]
    parts = [f"({p})" if " and " in p or " or " in p else p for p in parts]
    return (" and " if isinstance(condition, AssetAll) else " or ").join(parts)
