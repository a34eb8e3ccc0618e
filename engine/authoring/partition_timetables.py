"""The partition timetables (Airflow 3.3's ``CronPartitionTimetable``,
``PartitionedAssetTimetable``, ``PartitionedAtRuntime``): DAGs whose runs each process one
partition, named by its ``partition_key``.

- ``CronPartitionTimetable`` runs like ``CronTriggerTimetable`` and gives each run the key
  of its partition date: the run's tick moved by ``run_offset`` ticks, written with
  ``key_format`` on the timetable's wall clock (``partition_key_for``); ``run_for_key``
  goes back from a key to its run (a backfill of given keys).
- ``PartitionedAssetTimetable`` runs when partitioned asset events arrive: one run per
  downstream key whose asset condition is met for that key (the scheduler's decision is
  ``engine.authoring.partition_planning.plan_partitioned_runs``); ``mapper_for`` gives the
  mapper of each asset.
- ``PartitionedAtRuntime`` never schedules: runs are started by hand or by a backfill, and
  their tasks set the keys of the events they emit (``outlet_events[a].add_partitions``).

Pure: no clock is read, every datetime returned is aware UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.assets import BaseAsset, as_condition
from engine.authoring.cron import RESOLUTION, timezone_name
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.partition_mappers import (
    MAX_PARTITION_KEY_LENGTH,
    IdentityMapper,
    PartitionKeyError,
    PartitionMapper,
    check_mapper,
    mapper_from_json,
)
from engine.authoring.timetables import Timetable
from engine.authoring.trigger_timetables import CronTriggerTimetable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.authoring.timetables import DagRunInfo, DataInterval, TimeRestriction

DEFAULT_KEY_FORMAT: Final = "%Y-%m-%dT%H:%M:%S"
_KEY_CHECK_FROM: Final = datetime(2001, 1, 1)  # a Monday: where key_format is checked


class CronPartitionTimetable(CronTriggerTimetable):
    """Runs at each tick of ``cron`` in ``timezone``, like ``CronTriggerTimetable``; each run
    processes the partition of its *partition date*: its tick moved by ``run_offset`` ticks
    (1: the next tick's, -1: the previous tick's, so a daily run at 00:00 processes the day
    before), written with ``key_format`` on the wall clock of ``timezone``. Without a
    start_date and without catchup the first run waits for the next tick
    (``run_immediately=False``, as Airflow's)."""

    json_type = "cron_partition"

    def __init__(
        self,
        cron: str,
        *,
        timezone: str | tzinfo = "UTC",
        run_offset: int | None = None,
        run_immediately: bool | timedelta = False,
        key_format: str = DEFAULT_KEY_FORMAT,
    ) -> None:
        super().__init__(cron, timezone=timezone, run_immediately=run_immediately)
        where = caller_location()
        if run_offset is not None and (
            isinstance(run_offset, bool) or not isinstance(run_offset, int)
        ):
            raise DagDefinitionError(
                f"{where}: CronPartitionTimetable run_offset must be a whole number of cron "
                f"ticks (e.g. -1: the previous tick's partition), got {run_offset!r}"
            )
        self.run_offset = run_offset or 0
        self.key_format = _check_key_format(self, key_format, where=where)
        self.description = f"{self.description}; partition key {key_format}"

    def _shift(self, tick: datetime, steps: int) -> datetime:
        """``tick`` moved by ``steps`` ticks of the cron (forward if positive)."""
        moment = tick
        for _ in range(abs(steps)):
            if steps > 0:
                moment = self._cron.after(moment)
            else:
                previous = self._cron.before(moment)
                if previous is None:  # pragma: no cover - a cron always ticks before
                    raise ValueError(f"no tick of {self.expression!r} before {moment}")
                moment = previous
        return moment

    def partition_date_for(self, tick: datetime) -> datetime:
        """The partition date of the run at ``tick`` (aware UTC)."""
        return self._shift(tick, self.run_offset)

    def key_of(self, partition_date: datetime) -> str:
        """A partition date's key: ``key_format`` on the timetable's wall clock."""
        return partition_date.astimezone(self.zone).strftime(self.key_format)

    def partition_key_for(self, info: DagRunInfo) -> str | None:
        return self.key_of(self.partition_date_for(info.logical_date))

    def run_for_key(self, key: str) -> DagRunInfo:
        """The time run whose partition key is ``key`` (a backfill by keys);
        PartitionKeyError if ``key`` is not one of the timetable's keys."""
        try:
            parsed = datetime.strptime(key, self.key_format)
        except ValueError as exc:
            raise PartitionKeyError(
                f"{key!r} is not a partition key of CronPartitionTimetable "
                f"{self.expression!r}: key_format {self.key_format!r} cannot read it ({exc})"
            ) from exc
        local = parsed.replace(tzinfo=self.zone) if parsed.tzinfo is None else parsed
        partition_date = self._cron.after(local.astimezone(UTC) - RESOLUTION)
        if self.key_of(partition_date) != key:
            raise PartitionKeyError(
                f"{key!r} is not a partition key of CronPartitionTimetable {self.expression!r} "
                f"in {timezone_name(self.zone)} (the nearest is "
                f"{self.key_of(partition_date)!r})"
            )
        return self._run_at(self._shift(partition_date, -self.run_offset))

    def serialize(self) -> dict[str, Any]:
        stored = super().serialize()
        del stored["interval"]
        return {**stored, "run_offset": self.run_offset, "key_format": self.key_format}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CronPartitionTimetable:
        texts = {name: data.get(name) for name in ("expression", "timezone", "key_format")}
        offset, immediately = data.get("run_offset"), data.get("run_immediately")
        if not all(isinstance(value, str) for value in texts.values()):
            raise ValueError("expression, timezone and key_format must be strings")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise ValueError(f"run_offset must be an int, got {offset!r}")
        if not isinstance(immediately, bool):
            if not isinstance(immediately, int | float):
                raise ValueError(f"run_immediately must be a bool or seconds, got {immediately!r}")
            immediately = timedelta(seconds=immediately)
        return cls(
            str(texts["expression"]),
            timezone=str(texts["timezone"]),
            run_offset=offset,
            run_immediately=immediately,
            key_format=str(texts["key_format"]),
        )


def _check_key_format(timetable: CronPartitionTimetable, key_format: object, *, where: str) -> str:
    """``key_format``, if it gives every run of a few ticks its own key of at most 250
    characters; DagDefinitionError otherwise."""
    if not isinstance(key_format, str) or "%" not in key_format:
        raise DagDefinitionError(
            f"{where}: CronPartitionTimetable key_format must be a strftime format such as "
            f"'%Y-%m-%d', got {key_format!r}"
        )
    timetable.key_format = key_format
    start = _KEY_CHECK_FROM.replace(tzinfo=timetable.zone)
    ticks = [timetable._cron.after(start)]
    for _ in range(3):
        ticks.append(timetable._cron.after(ticks[-1]))
    keys = [timetable.key_of(tick) for tick in ticks]
    if len(set(keys)) < len(keys):
        raise DagDefinitionError(
            f"{where}: CronPartitionTimetable key_format {key_format!r} gives several runs of "
            f"{timetable.expression!r} the same partition key ({keys[0]!r}, {keys[1]!r}, ...); "
            "include the fields that tell its ticks apart (e.g. '%H' for an hourly cron)"
        )
    if max(len(key) for key in keys) > MAX_PARTITION_KEY_LENGTH:
        raise DagDefinitionError(f"{where}: key_format gives keys over 250 characters")
    return key_format


class _NeverScheduled(Timetable):
    """A timetable that makes no time runs (asset-triggered, or run by hand)."""

    periodic = False

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        return None

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        return []


class PartitionedAssetTimetable(_NeverScheduled):
    """Runs once per partition key when its partitioned asset events arrive.

    ``assets`` is an asset condition as for ``schedule=`` (an asset, a list of them, ``a & b``,
    ``a | b``), met *per key*: a run for key K needs, for each asset the condition requires,
    an event whose key maps to K. Each asset's key goes through its mapper:
    ``partition_mapper_config`` maps assets (or conditions: each of their assets) to a
    mapper, every other asset uses ``default_partition_mapper`` (``IdentityMapper()``).
    """

    json_type = "partitioned_asset"
    summary = "Partitioned Asset"
    partitioned: ClassVar[bool] = True

    def __init__(
        self,
        *,
        assets: BaseAsset | list[BaseAsset],
        partition_mapper_config: Mapping[BaseAsset, PartitionMapper] | None = None,
        default_partition_mapper: PartitionMapper | None = None,
    ) -> None:
        where = caller_location()
        condition = as_condition(assets, where=where)
        if condition is None:
            raise DagDefinitionError(f"{where}: PartitionedAssetTimetable needs assets, got None")
        if condition.alias_names():
            raise DagDefinitionError(
                f"{where}: PartitionedAssetTimetable cannot wait on asset aliases "
                f"({', '.join(condition.alias_names())}); name the assets"
            )
        self.asset_condition: BaseAsset = condition
        self.default_partition_mapper = _mapper_arg(
            IdentityMapper() if default_partition_mapper is None else default_partition_mapper,
            "default_partition_mapper",
            where=where,
        )
        self.partition_mapper_config = dict(partition_mapper_config or {})
        self._mappers = _mappers_by_name(condition, self.partition_mapper_config, where=where)
        names = ", ".join(condition.asset_names())
        self.description = f"Per partition key, when {names} have events for it"

    @property
    def is_rollup(self) -> bool:
        """Whether some asset's mapper is a rollup."""
        mappers = (self.default_partition_mapper, *self._mappers.values())
        return any(mapper.is_rollup for mapper in mappers)

    def mapper_for(self, asset_name: str) -> PartitionMapper:
        """The mapper of the asset named ``asset_name``."""
        return self._mappers.get(asset_name, self.default_partition_mapper)

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "assets": self.asset_condition.to_json(),
            "partition_mappers": {
                name: mapper.serialize() for name, mapper in sorted(self._mappers.items())
            },
            "default_partition_mapper": self.default_partition_mapper.serialize(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionedAssetTimetable:
        condition = BaseAsset.from_json(data.get("assets"))
        stored = data.get("partition_mappers")
        if not isinstance(stored, dict):
            raise ValueError(f"partition_mappers must be an object, got {stored!r}")
        assets = {leaf.name: leaf for leaf in condition.iter_asset_leaves()}
        unknown = sorted(set(stored) - set(assets))
        if unknown:
            raise ValueError(f"partition_mappers name assets not in the condition: {unknown}")
        config: dict[BaseAsset, PartitionMapper] = {
            assets[name]: mapper_from_json(value) for name, value in stored.items()
        }
        default = mapper_from_json(data.get("default_partition_mapper"))
        return cls(
            assets=condition, partition_mapper_config=config, default_partition_mapper=default
        )


def _mapper_arg(value: object, name: str, *, where: str) -> PartitionMapper:
    return check_mapper(value, f"PartitionedAssetTimetable {name}", where=where)


def _mappers_by_name(
    condition: BaseAsset, config: Mapping[BaseAsset, PartitionMapper], *, where: str
) -> dict[str, PartitionMapper]:
    """Asset name -> its configured mapper; DagDefinitionError for an asset outside the
    condition, an alias, or an asset given two different mappers."""
    known = set(condition.asset_names())
    out: dict[str, PartitionMapper] = {}
    for key, mapper in config.items():
        if not isinstance(key, BaseAsset) or key.alias_names():
            raise DagDefinitionError(
                f"{where}: partition_mapper_config keys must be assets, got {key!r}"
            )
        checked = _mapper_arg(mapper, f"partition_mapper_config[{key!r}]", where=where)
        for name in key.asset_names():
            if name not in known:
                raise DagDefinitionError(
                    f"{where}: partition_mapper_config names asset {name!r}, which is not in "
                    f"the timetable's assets ({', '.join(sorted(known))})"
                )
            if name in out and out[name] != checked:
                raise DagDefinitionError(
                    f"{where}: partition_mapper_config gives asset {name!r} two mappers: "
                    f"{out[name]!r} and {checked!r}"
                )
            out[name] = checked
    return out


class PartitionedAtRuntime(_NeverScheduled):
    """Never schedules a run: runs are started by hand or by a backfill, and their tasks
    choose the partition keys of the events they emit
    (``outlet_events[asset].add_partitions([...])``)."""

    json_type = "partitioned_at_runtime"
    summary = "Partitioned at runtime"
    description = "Never; tasks set the partition keys of their events at run time"
    partitioned_at_runtime: ClassVar[bool] = True


#: ``airflow.sdk``'s own spelling of the name (its ``__all__`` exports ``PartitionAtRuntime``;
#: its timetable module and documentation say ``PartitionedAtRuntime``): one class, two names.
PartitionAtRuntime = PartitionedAtRuntime
