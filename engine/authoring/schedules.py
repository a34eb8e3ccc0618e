"""A DAG's ``schedule`` argument, and timetables as the metadata database stores them.

``resolve_schedule`` turns what a DAG file passes as ``schedule`` into a timetable and an
asset condition: None (manual runs only), a cron string or preset (``"@daily"``), a
``timedelta``, a timetable, an asset, a list of assets or a condition built with ``&`` and
``|``, or ``AssetOrTimeSchedule``. ``Timetable.serialize`` gives the JSON the DAG processor
stores in ``dag.timetable``; ``timetable_from_json`` rebuilds it for the scheduler, backfill
and the CLI.
"""

from __future__ import annotations

from datetime import timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import BaseAsset, as_condition
from engine.authoring.cron import check_delta
from engine.authoring.errors import DagDefinitionError
from engine.authoring.events_timetable import EventsTimetable
from engine.authoring.interval_timetables import (
    CronDataIntervalTimetable,
    DeltaDataIntervalTimetable,
)
from engine.authoring.partition_timetables import (
    CronPartitionTimetable,
    PartitionedAssetTimetable,
    PartitionedAtRuntime,
)
from engine.authoring.timetables import (
    CONTINUOUS,
    ONCE,
    AssetOrTimeSchedule,
    ContinuousTimetable,
    OnceTimetable,
    Timetable,
    check_cron,
)
from engine.authoring.trigger_timetables import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def resolve_schedule(
    schedule: object, *, timezone: tzinfo, where: str
) -> tuple[Timetable | None, BaseAsset | None]:
    """A DAG's ``schedule`` as (timetable, asset condition); either or both may be None."""
    if schedule is None:
        return None, None
    if isinstance(schedule, AssetOrTimeSchedule | PartitionedAssetTimetable):
        return schedule, schedule.asset_condition
    if isinstance(schedule, Timetable):
        return schedule, None
    if isinstance(schedule, str):
        if schedule == ONCE:
            return OnceTimetable(), None
        if schedule == CONTINUOUS:
            return ContinuousTimetable(), None
        check_cron(schedule, where=where)  # the error names `where`, not this frame
        return CronTriggerTimetable(schedule, timezone=timezone), None
    if isinstance(schedule, timedelta):
        check_delta(schedule, "a timedelta schedule", where=where, positive=True)
        return DeltaTriggerTimetable(schedule), None
    if isinstance(schedule, BaseAsset | list | tuple):
        return None, as_condition(schedule, where=where)
    raise DagDefinitionError(
        f"{where}: schedule must be None (manual runs only), a cron expression ('0 3 * * *'), "
        "a preset ('@hourly', '@daily', '@weekly', '@monthly', '@yearly', '@once', "
        "'@continuous'), a datetime.timedelta, a timetable (CronTriggerTimetable(...), "
        "CronDataIntervalTimetable(...), DeltaTriggerTimetable(...), ...), an Asset, a list "
        "of assets, an asset condition (a & b, a | b) or AssetOrTimeSchedule(...); got "
        f"{type(schedule).__name__} {schedule!r}"
    )


def _seconds(data: Mapping[str, Any], key: str) -> timedelta:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number of seconds, got {value!r}")
    return timedelta(seconds=value)


def _run_immediately_from(data: Mapping[str, Any]) -> bool | timedelta:
    value = data.get("run_immediately")
    return value if isinstance(value, bool) else _seconds(data, "run_immediately")


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _from_cron_trigger(data: Mapping[str, Any]) -> Timetable:
    return CronTriggerTimetable(
        _text(data, "expression"),
        timezone=_text(data, "timezone"),
        interval=_seconds(data, "interval"),
        run_immediately=_run_immediately_from(data),
    )


def _from_multiple_cron(data: Mapping[str, Any]) -> Timetable:
    crons = data.get("expressions")
    if not isinstance(crons, list) or not all(isinstance(cron, str) for cron in crons):
        raise ValueError(f"expressions must be a list of strings, got {crons!r}")
    return MultipleCronTriggerTimetable(
        *crons,
        timezone=_text(data, "timezone"),
        interval=_seconds(data, "interval"),
        run_immediately=_run_immediately_from(data),
    )


def _from_asset_or_time(data: Mapping[str, Any]) -> Timetable:
    inner = timetable_from_json(data.get("timetable"))
    return AssetOrTimeSchedule(timetable=inner, assets=BaseAsset.from_json(data.get("assets")))


_READERS: Final[Mapping[str, Callable[[Mapping[str, Any]], Timetable]]] = {
    OnceTimetable.json_type: lambda data: OnceTimetable(),
    ContinuousTimetable.json_type: lambda data: ContinuousTimetable(),
    CronTriggerTimetable.json_type: _from_cron_trigger,
    MultipleCronTriggerTimetable.json_type: _from_multiple_cron,
    CronDataIntervalTimetable.json_type: lambda data: CronDataIntervalTimetable(
        _text(data, "expression"), _text(data, "timezone")
    ),
    DeltaTriggerTimetable.json_type: lambda data: DeltaTriggerTimetable(
        _seconds(data, "delta"), interval=_seconds(data, "interval")
    ),
    DeltaDataIntervalTimetable.json_type: lambda data: DeltaDataIntervalTimetable(
        _seconds(data, "delta")
    ),
    AssetOrTimeSchedule.json_type: _from_asset_or_time,
    CronPartitionTimetable.json_type: CronPartitionTimetable.from_json,
    PartitionedAssetTimetable.json_type: PartitionedAssetTimetable.from_json,
    PartitionedAtRuntime.json_type: lambda data: PartitionedAtRuntime(),
    EventsTimetable.json_type: EventsTimetable.from_json,
}


def timetable_from_json(data: object) -> Timetable:
    """Rebuild a timetable stored by ``Timetable.serialize``; ValueError on bad data."""
    if not isinstance(data, dict):
        raise ValueError(f"a stored timetable must be a JSON object, got {data!r}")
    kind = data.get("__type")
    reader = _READERS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        raise ValueError(f"unknown timetable type {data.get('__type')!r}")
    try:
        return reader(data)
    except ValueError as exc:  # DagDefinitionError is one too
        raise ValueError(f"stored timetable {data!r} is invalid: {exc}") from exc
