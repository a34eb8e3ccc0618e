"""Rollup windows and wait policies (Airflow 3.3's ``HourWindow`` ... ``SegmentWindow``,
``WaitForAll``, ``MinimumCount``): which upstream partitions make up one downstream
partition, and when enough of them have arrived.

A window works on the *decoded* form of a downstream key, handed to it by the upstream
mapper of a ``RollupMapper`` or ``FanOutMapper`` (``engine.authoring.partition_mappers``):
an aware datetime in the mapper's time zone for the temporal windows (the start of the
period), the key itself for ``SegmentWindow``. ``members`` returns the decoded upstream
partitions of that period, which the mapper encodes back to key strings.

Theory of operation (time zones). Periods are calendar periods of the mapper's zone.
Windows made of hours or minutes step on the real time line from the period start to the
next period start, so a local day has 23, 24 or 25 hours (a fall-back day's repeated hour
gives the same key twice unless the key format carries the offset, ``%z``); windows made
of days or months step on the wall calendar. Airflow 3.3.2 steps 24 naive hours, which on
a spring-forward day expects an hour that never exists, so such a rollup never fires.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

#: the periods of the temporal mappers and windows, finest first
PERIODS: Final = ("hour", "day", "week", "month", "quarter", "year")


def _wall(moment: datetime, days: int = 0, months: int = 0) -> datetime:
    """``moment``'s wall clock moved by whole days / months, placed back in its zone."""
    naive = moment.replace(tzinfo=None) + timedelta(days=days)
    if months:
        total = naive.month - 1 + months
        naive = naive.replace(year=naive.year + total // 12, month=total % 12 + 1)
    return naive.replace(tzinfo=moment.tzinfo)


def _real_steps(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Every ``step`` of real time from ``start`` (inclusive) to ``end`` (exclusive), in
    ``start``'s zone."""
    zone, moment, stop = start.tzinfo, start.astimezone(UTC), end.astimezone(UTC)
    out: list[datetime] = []
    while moment < stop:
        out.append(moment.astimezone(zone))
        moment += step
    return out


class Window:
    """Which upstream partitions make up one downstream partition (see the module doc).

    ``period`` names the grain of the upstream mapper it pairs with (a ``DayWindow`` with
    ``StartOfDayMapper``); None for a window of plain keys (``SegmentWindow``).
    ``max_members`` bounds the members of one period (for ``MinimumCount``'s check).
    """

    json_type: ClassVar[str] = ""
    period: ClassVar[str | None] = None
    max_members: ClassVar[int] = 0
    default_fan_out_period: ClassVar[str | None] = None  # FanOutMapper's downstream mapper

    def members(self, decoded: Any) -> list[Any]:
        """The decoded upstream partitions of the period ``decoded``, in order."""
        raise NotImplementedError

    def size_limit(self) -> int:
        """The most members one period can have."""
        return self.max_members

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Window):
            return NotImplemented
        return self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class HourWindow(Window):
    """The sixty minutes of an hour (pair with ``StartOfHourMapper``)."""

    json_type = "hour_window"
    period = "hour"
    max_members = 60

    def members(self, decoded: datetime) -> list[datetime]:
        return _real_steps(decoded, decoded + timedelta(hours=1), timedelta(minutes=1))


class DayWindow(Window):
    """The hours of a day in the mapper's zone: 24, or 23 / 25 on a DST change (pair with
    ``StartOfDayMapper``)."""

    json_type = "day_window"
    period = "day"
    max_members = 25
    default_fan_out_period = "hour"

    def members(self, decoded: datetime) -> list[datetime]:
        return _real_steps(decoded, _wall(decoded, days=1), timedelta(hours=1))


class WeekWindow(Window):
    """The seven days of an ISO week, Monday first (pair with ``StartOfWeekMapper``)."""

    json_type = "week_window"
    period = "week"
    max_members = 7
    default_fan_out_period = "day"

    def members(self, decoded: datetime) -> list[datetime]:
        return [_wall(decoded, days=i) for i in range(7)]


class MonthWindow(Window):
    """The 28 to 31 days of a calendar month (pair with ``StartOfMonthMapper``)."""

    json_type = "month_window"
    period = "month"
    max_members = 31
    default_fan_out_period = "day"

    def members(self, decoded: datetime) -> list[datetime]:
        days = (_wall(decoded, months=1).replace(tzinfo=None) - decoded.replace(tzinfo=None)).days
        return [_wall(decoded, days=i) for i in range(days)]


class QuarterWindow(Window):
    """The three months of a calendar quarter (pair with ``StartOfQuarterMapper``)."""

    json_type = "quarter_window"
    period = "quarter"
    max_members = 3
    default_fan_out_period = "month"

    def members(self, decoded: datetime) -> list[datetime]:
        return [_wall(decoded, months=i) for i in range(3)]


class YearWindow(Window):
    """The twelve months of a calendar year (pair with ``StartOfYearMapper``)."""

    json_type = "year_window"
    period = "year"
    max_members = 12
    default_fan_out_period = "month"

    def members(self, decoded: datetime) -> list[datetime]:
        return [_wall(decoded, months=i) for i in range(12)]


class SegmentWindow(Window):
    """A fixed set of keys that together make one downstream partition, whatever its key:
    ``RollupMapper(upstream_mapper=FixedKeyMapper("all_regions"),
    window=SegmentWindow(["us", "eu", "apac"]))`` runs once all three regions arrived."""

    json_type = "segment_window"

    def __init__(self, segments: Iterable[str]) -> None:
        where = caller_location()
        if isinstance(segments, str):
            raise DagDefinitionError(
                f"{where}: SegmentWindow takes a list of keys, got the string {segments!r}"
            )
        items = list(segments)
        for index, item in enumerate(items):
            if not isinstance(item, str) or not item:
                raise DagDefinitionError(
                    f"{where}: SegmentWindow keys must be non-empty strings, got {item!r} at "
                    f"index {index}"
                )
        if not items:
            raise DagDefinitionError(f"{where}: SegmentWindow needs at least one key")
        self.segments: tuple[str, ...] = tuple(dict.fromkeys(items))

    def members(self, decoded: Any) -> list[str]:
        return list(self.segments)

    def size_limit(self) -> int:
        return len(self.segments)

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type, "segments": list(self.segments)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SegmentWindow):
            return NotImplemented
        return set(self.segments) == set(other.segments)

    def __hash__(self) -> int:
        return hash(frozenset(self.segments))

    def __repr__(self) -> str:
        return f"SegmentWindow({list(self.segments)!r})"


# --- wait policies -----------------------------------------------------------------------


class WaitPolicy:
    """When a rollup's downstream partition may run, given how many of its upstream keys
    have arrived (``matched``) out of how many the window has (``expected``)."""

    json_type: ClassVar[str] = ""

    def is_met(self, matched: int, expected: int) -> bool:
        raise NotImplementedError

    def check_window(self, window: Window, *, where: str) -> None:
        """DagDefinitionError if the policy can never be met by ``window``."""

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WaitPolicy):
            return NotImplemented
        return self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash(repr(self))


class WaitForAll(WaitPolicy):
    """Runs once every upstream key of the window has arrived (the default)."""

    json_type = "wait_for_all"

    def is_met(self, matched: int, expected: int) -> bool:
        return matched >= expected

    def __repr__(self) -> str:
        return "WaitForAll()"


class MinimumCount(WaitPolicy):
    """Runs once ``n`` upstream keys of the window have arrived (``n > 0``), or once at most
    ``-n`` are still missing (``n < 0``). A window with fewer than ``n`` keys (a 23-hour
    DST day and ``MinimumCount(24)``) runs once all its keys arrived."""

    json_type = "minimum_count"

    def __init__(self, n: int) -> None:
        where = caller_location()
        if isinstance(n, bool) or not isinstance(n, int):
            raise DagDefinitionError(f"{where}: MinimumCount(n) takes an int, got {n!r}")
        if n == 0:
            raise DagDefinitionError(
                f"{where}: MinimumCount(0) would run with no upstream key at all; use "
                "MinimumCount(n) with n > 0 (at least n keys) or n < 0 (at most -n missing), "
                "or WaitForAll()"
            )
        self.n = n

    def is_met(self, matched: int, expected: int) -> bool:
        if self.n > 0:
            return matched >= min(self.n, expected)
        return matched >= max(0, expected + self.n)

    def check_window(self, window: Window, *, where: str) -> None:
        limit = window.size_limit()
        if self.n > limit:
            raise DagDefinitionError(
                f"{where}: {self!r} can never be met: {window!r} has at most {limit} upstream keys"
            )

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type, "n": self.n}

    def __repr__(self) -> str:
        return f"MinimumCount({self.n})"


def as_wait_policy(value: object, *, where: str) -> WaitPolicy:
    """``wait_policy=`` as a policy: None or ``WaitForAll`` (the class) mean WaitForAll()."""
    if value is None or value is WaitForAll:
        return WaitForAll()
    if not isinstance(value, WaitPolicy) or type(value).__module__ != __name__:
        raise DagDefinitionError(
            f"{where}: wait_policy must be WaitForAll() or MinimumCount(n) (policy classes of "
            f"a DAG file cannot be stored), got {value!r}"
        )
    return value


# --- stored form ---------------------------------------------------------------------------

_SIMPLE_WINDOWS: Final[Mapping[str, Callable[[], Window]]] = {
    kind.json_type: kind
    for kind in (HourWindow, DayWindow, WeekWindow, MonthWindow, QuarterWindow, YearWindow)
}


def window_from_json(data: object) -> Window:
    """Rebuild a window stored by ``Window.serialize``; ValueError on bad data."""
    kind = data.get("__type") if isinstance(data, dict) else None
    if isinstance(kind, str) and kind in _SIMPLE_WINDOWS:
        return _SIMPLE_WINDOWS[kind]()
    if kind == SegmentWindow.json_type and isinstance(data, dict):
        segments = data.get("segments")
        if not isinstance(segments, list):
            raise ValueError(f"stored SegmentWindow needs a list of segments, got {data!r}")
        return SegmentWindow(segments)
    raise ValueError(f"unknown stored partition window {data!r}")


def wait_policy_from_json(data: object) -> WaitPolicy:
    """Rebuild a wait policy stored by ``WaitPolicy.serialize``; ValueError on bad data."""
    kind = data.get("__type") if isinstance(data, dict) else None
    if kind == WaitForAll.json_type:
        return WaitForAll()
    if kind == MinimumCount.json_type and isinstance(data, dict):
        n = data.get("n")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"stored MinimumCount needs an int n, got {data!r}")
        return MinimumCount(n)
    raise ValueError(f"unknown stored wait policy {data!r}")
