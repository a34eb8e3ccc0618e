"""Rollup and fan-out mappers (Airflow 3.3's ``RollupMapper`` and ``FanOutMapper``): an
upstream mapper and a window (``engine.authoring.partition_windows``) make many upstream
partitions one downstream partition, or one upstream partition many downstream ones.

The upstream mapper maps an upstream key to the coarse key (``StartOfDayMapper``: an hour
to its day) and reads a coarse key back to its period start; the window lists the period's
members (``DayWindow``: its hours), which the upstream mapper writes as upstream keys (a
rollup's expected keys) or a downstream mapper writes as downstream keys (a fan-out's
keys). The window must match the upstream mapper's grain; that is checked when the mapper
is built, not when the scheduler first meets a key. Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.partition_mappers import (
    ChainMapper,
    IdentityMapper,
    PartitionKeyError,
    PartitionMapper,
    ProductMapper,
    check_mapper,
    mapper_from_json,
)
from engine.authoring.partition_temporal import MAPPER_OF_PERIOD, TemporalMapper
from engine.authoring.partition_windows import (
    Window,
    as_wait_policy,
    wait_policy_from_json,
    window_from_json,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.authoring.partition_windows import WaitPolicy

_CACHED_KEYS: Final = 256  # downstream keys whose expected upstream keys a rollup keeps


def _check_pairing(kind: str, upstream: PartitionMapper, window: object, *, where: str) -> Window:
    """The window, if ``upstream`` decodes to what it reads (same temporal grain, or plain
    keys for a SegmentWindow); DagDefinitionError otherwise."""
    if not isinstance(window, Window) or type(window).__module__ != Window.__module__:
        raise DagDefinitionError(
            f"{where}: {kind} window must be DayWindow(), WeekWindow(), ... or "
            f"SegmentWindow([...]) (window classes of a DAG file cannot be stored), got "
            f"{window!r}"
        )
    period = upstream.period if isinstance(upstream, TemporalMapper) else None
    if period != window.period or isinstance(upstream, ProductMapper | ChainMapper | FanOutMapper):
        wanted = (
            f"StartOf{window.period.capitalize()}Mapper(...)"
            if window.period is not None
            else "a mapper of plain keys (FixedKeyMapper, IdentityMapper, AllowedKeyMapper)"
        )
        raise DagDefinitionError(
            f"{where}: {kind}'s upstream_mapper {upstream!r} does not match {window!r}: "
            f"pair it with {wanted}"
        )
    if isinstance(upstream, TemporalMapper):
        upstream.check_readable(where=where)
    return window


class RollupMapper(PartitionMapper):
    """Many upstream partitions make one downstream partition: ``upstream_mapper`` maps each
    upstream key to its downstream key (``StartOfDayMapper()``: an hour to its day),
    ``window`` says which upstream keys make up a downstream key (``DayWindow()``: the day's
    hours) and ``wait_policy`` when enough have arrived (``WaitForAll()``, the default, or
    ``MinimumCount(n)``). An upstream key that is not a member of its downstream key's
    window (an hour key ``09:30:00``) is refused."""

    json_type = "rollup"
    is_rollup = True

    def __init__(
        self,
        *,
        upstream_mapper: PartitionMapper,
        window: Window,
        wait_policy: WaitPolicy | None = None,
    ) -> None:
        where = caller_location()
        self.upstream_mapper = check_mapper(upstream_mapper, "upstream_mapper", where=where)
        self.window = _check_pairing("RollupMapper", self.upstream_mapper, window, where=where)
        self.wait_policy = as_wait_policy(wait_policy, where=where)
        self.wait_policy.check_window(self.window, where=where)
        self._expected: dict[str, frozenset[str]] = {}  # a cache: the mapper never changes

    def to_downstream(self, key: str) -> str:
        downstream = self.upstream_mapper.to_downstream(key)
        assert isinstance(downstream, str)  # the pairing check allows single-key mappers only
        if key not in self.expected_upstream_keys(downstream):
            example = min(self.expected_upstream_keys(downstream))
            raise PartitionKeyError(
                f"partition key {key!r} is not one of the upstream keys of {downstream!r} in "
                f"the rollup's {self.window!r} (such as {example!r}): a rollup counts only the "
                "keys of its window, in its upstream mapper's input_format"
            )
        return downstream

    def expected_upstream_keys(self, downstream_key: str) -> frozenset[str]:
        """Every upstream key that makes up ``downstream_key``."""
        keys = self._expected.get(downstream_key)
        if keys is None:
            decoded = self.upstream_mapper.decode_downstream(downstream_key)
            members = self.window.members(decoded)
            keys = frozenset(self.upstream_mapper.encode_upstream(m) for m in members)
            if len(self._expected) >= _CACHED_KEYS:
                self._expected.clear()
            self._expected[downstream_key] = keys
        return keys

    def is_satisfied(self, downstream_key: str, arrived: frozenset[str]) -> bool:
        """Whether the upstream keys that ``arrived`` are enough to run ``downstream_key``."""
        expected = self.expected_upstream_keys(downstream_key)
        return self.wait_policy.is_met(len(expected & arrived), len(expected))

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "upstream_mapper": self.upstream_mapper.serialize(),
            "window": self.window.serialize(),
            "wait_policy": self.wait_policy.serialize(),
        }

    def __repr__(self) -> str:
        return (
            f"RollupMapper(upstream_mapper={self.upstream_mapper!r}, window={self.window!r}, "
            f"wait_policy={self.wait_policy!r})"
        )

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        return cls(
            upstream_mapper=mapper_from_json(data.get("upstream_mapper")),
            window=window_from_json(data.get("window")),
            wait_policy=wait_policy_from_json(data.get("wait_policy")),
        )


class FanOutMapper(PartitionMapper):
    """One upstream partition makes several downstream partitions, one DAG run each:
    ``FanOutMapper(upstream_mapper=StartOfWeekMapper(), window=WeekWindow())`` runs the
    seven days of an upstream week. ``downstream_mapper`` formats each member; without it,
    the window's natural one, in the upstream mapper's time zone (``StartOfHourMapper``
    for a DayWindow, ``StartOfDayMapper`` for a week or month, ``StartOfMonthMapper`` for a
    quarter or year, ``IdentityMapper`` for a SegmentWindow). An ``HourWindow`` needs one
    given."""

    json_type = "fan_out"

    def __init__(
        self,
        *,
        upstream_mapper: PartitionMapper,
        window: Window,
        downstream_mapper: PartitionMapper | None = None,
    ) -> None:
        where = caller_location()
        self.upstream_mapper = check_mapper(upstream_mapper, "upstream_mapper", where=where)
        self.window = _check_pairing("FanOutMapper", self.upstream_mapper, window, where=where)
        if downstream_mapper is None:
            downstream_mapper = _default_downstream(self.upstream_mapper, self.window, where=where)
        self.downstream_mapper = check_mapper(downstream_mapper, "downstream_mapper", where=where)
        if self.downstream_mapper.is_rollup or isinstance(self.downstream_mapper, FanOutMapper):
            raise DagDefinitionError(
                f"{where}: FanOutMapper downstream_mapper must give one key per member, got "
                f"{self.downstream_mapper!r}"
            )
        writes_dates = isinstance(self.downstream_mapper, TemporalMapper)
        if writes_dates != (self.window.period is not None):
            wanted = "a StartOf...Mapper" if self.window.period else "a mapper of plain keys"
            raise DagDefinitionError(
                f"{where}: FanOutMapper downstream_mapper {self.downstream_mapper!r} cannot "
                f"write the members of {self.window!r}; give {wanted}"
            )

    def to_downstream(self, key: str) -> tuple[str, ...]:
        coarse = self.upstream_mapper.to_downstream(key)
        assert isinstance(coarse, str)  # the pairing check allows single-key mappers only
        members = self.window.members(self.upstream_mapper.decode_downstream(coarse))
        return tuple(dict.fromkeys(self.downstream_mapper.format_member(m) for m in members))

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "upstream_mapper": self.upstream_mapper.serialize(),
            "window": self.window.serialize(),
            "downstream_mapper": self.downstream_mapper.serialize(),
        }

    def __repr__(self) -> str:
        return (
            f"FanOutMapper(upstream_mapper={self.upstream_mapper!r}, window={self.window!r}, "
            f"downstream_mapper={self.downstream_mapper!r})"
        )

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        return cls(
            upstream_mapper=mapper_from_json(data.get("upstream_mapper")),
            window=window_from_json(data.get("window")),
            downstream_mapper=mapper_from_json(data.get("downstream_mapper")),
        )


def _default_downstream(
    upstream: PartitionMapper, window: Window, *, where: str
) -> PartitionMapper:
    """The window's natural downstream mapper, in the upstream mapper's time zone."""
    if window.period is None:
        return IdentityMapper()
    period = window.default_fan_out_period
    if period is None:
        raise DagDefinitionError(
            f"{where}: FanOutMapper over {window!r} needs a downstream_mapper (e.g. "
            "StartOfHourMapper(output_format='%Y-%m-%dT%H:%M')): there is no minute mapper"
        )
    assert isinstance(upstream, TemporalMapper)  # the pairing check
    return MAPPER_OF_PERIOD[period](timezone=upstream.zone)
