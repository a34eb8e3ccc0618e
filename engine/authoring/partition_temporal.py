"""The temporal partition mappers (Airflow 3.3's ``StartOfHourMapper`` ...
``StartOfYearMapper``): a date key to the key of the hour, day, ISO week, month, quarter or
year that contains it, in a time zone.

``to_downstream`` reads an upstream key with ``input_format`` (a naive key is a wall time
of ``timezone``, a key with an offset is converted to it), moves it to the start of its
period and writes it with ``output_format``: ``2026-03-10T09:30:00`` is ``2026-03-10T09``
(hour), ``2026-03-10`` (day), ``2026-03-09 (W11)`` (week), ``2026-03`` (month),
``2026-Q1`` (quarter, ``{quarter}`` in the format) or ``2026`` (year). As a rollup's or
fan-out's upstream mapper it also reads a downstream key back to its period start
(``decode_downstream``) and writes a window's members as upstream keys in
``input_format`` (``encode_upstream``). Pure: no clock, no I/O.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.cron import timezone_name, timezone_of
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.partition_mappers import PartitionKeyError, PartitionMapper

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_INPUT_FORMAT: Final = "%Y-%m-%dT%H:%M:%S"
QUARTER: Final = "{quarter}"
#: the directives a downstream key can be read back with, and what they match
_READABLE: Final[Mapping[str, str]] = {
    "Y": r"\d{4}",
    "G": r"\d{4}",
    "m": r"\d{2}",
    "d": r"\d{2}",
    "H": r"\d{2}",
    "M": r"\d{2}",
    "S": r"\d{2}",
    "V": r"\d{2}",
    "j": r"\d{3}",
}
_SAMPLES: Final = (datetime(2024, 2, 29, 13, 45), datetime(2025, 12, 31, 23, 59))


def _key_pattern(fmt: str) -> re.Pattern[str] | None:
    """A regex reading a key written with ``fmt`` into named fields (None: not readable)."""
    parts: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(fmt):
        if fmt.startswith(QUARTER, i):
            name, pattern, i = "quarter", "[1-4]", i + len(QUARTER)
        elif fmt[i] == "%" and i + 1 < len(fmt):
            name, i = fmt[i + 1], i + 2
            if name == "%":
                parts.append("%")
                continue
            if name not in _READABLE:
                return None
            pattern = _READABLE[name]
        else:
            parts.append(re.escape(fmt[i]))
            i += 1
            continue
        if name in seen:
            parts.append(f"(?P={name})")
            continue
        seen.add(name)
        parts.append(f"(?P<{name}>{pattern})")
    return re.compile("".join(parts))


def _wall_start(fields: Mapping[str, str]) -> datetime:
    """The naive wall time the fields of a key name (missing fields: their first value)."""
    number = {name: int(value) for name, value in fields.items()}
    if "G" in number and "V" in number and "m" not in number:
        day = date.fromisocalendar(number["G"], number["V"], 1)
    elif "j" in number and "Y" in number:
        day = date(number["Y"], 1, 1) + timedelta(days=number["j"] - 1)
    else:
        month = number.get("m", 3 * (number["quarter"] - 1) + 1 if "quarter" in number else 1)
        day = date(number.get("Y", number.get("G", 1970)), month, number.get("d", 1))
    hms = (number.get("H", 0), number.get("M", 0), number.get("S", 0))
    return datetime(day.year, day.month, day.day, *hms)


class TemporalMapper(PartitionMapper):
    """A date key to the key of its period's start (see the module doc)."""

    period: ClassVar[str] = ""
    default_output_format: ClassVar[str] = ""

    def __init__(
        self,
        *,
        timezone: str | tzinfo = "UTC",
        input_format: str = DEFAULT_INPUT_FORMAT,
        output_format: str | None = None,
    ) -> None:
        where = caller_location()
        self.zone = timezone_of(timezone)
        self.input_format = self._check_format("input_format", input_format, where=where)
        output = self.default_output_format if output_format is None else output_format
        self.output_format = self._check_format("output_format", output, where=where)
        self._pattern = _key_pattern(self.output_format)

    def _check_format(self, name: str, fmt: object, *, where: str) -> str:
        if not isinstance(fmt, str) or "%" not in fmt:
            raise DagDefinitionError(
                f"{where}: {type(self).__name__} {name} must be a strftime format such as "
                f"'%Y-%m-%d', got {fmt!r}"
            )
        try:
            _SAMPLES[0].strftime(fmt)
        except ValueError as exc:
            raise DagDefinitionError(
                f"{where}: {type(self).__name__} {name} {fmt!r} is invalid: {exc}"
            ) from exc
        return fmt

    def start_of(self, moment: datetime) -> datetime:
        """The start of the period containing ``moment`` (aware, in the mapper's zone)."""
        raise NotImplementedError

    def write(self, start: datetime) -> str:
        """A period start as a downstream key, with ``output_format``."""
        quarter = (start.month - 1) // 3 + 1
        return start.strftime(self.output_format).replace(QUARTER, str(quarter))

    def read(self, key: str) -> datetime:
        """An upstream key as an aware datetime in the mapper's zone; PartitionKeyError if
        ``input_format`` cannot read it."""
        try:
            parsed = datetime.strptime(key, self.input_format)
        except ValueError as exc:
            raise PartitionKeyError(
                f"{type(self).__name__} cannot read partition key {key!r} as a date with "
                f"input_format {self.input_format!r}: {exc}"
            ) from exc
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=self.zone)
        return parsed.astimezone(self.zone)

    def to_downstream(self, key: str) -> str:
        return self.write(self.start_of(self.read(key)))

    def decode_downstream(self, key: str) -> datetime:
        match = None if self._pattern is None else self._pattern.fullmatch(key)
        start = None
        if match is not None:
            try:
                start = self.start_of(_wall_start(match.groupdict()).replace(tzinfo=self.zone))
            except ValueError:
                start = None
        if start is None or self.write(start) != key:
            raise PartitionKeyError(
                f"{key!r} is not a key of {type(self).__name__} with output_format "
                f"{self.output_format!r} (such as {self.write(self.start_of(self.sample()))!r})"
            )
        return start

    def sample(self) -> datetime:
        return _SAMPLES[0].replace(tzinfo=self.zone)

    def encode_upstream(self, decoded: Any) -> str:
        assert isinstance(decoded, datetime)
        return decoded.astimezone(self.zone).strftime(self.input_format)

    def format_member(self, decoded: Any) -> str:
        assert isinstance(decoded, datetime)
        return self.write(decoded.astimezone(self.zone))

    def check_readable(self, *, where: str) -> None:
        """DagDefinitionError unless every downstream key reads back to its period."""
        for sample in _SAMPLES:
            start = self.start_of(sample.replace(tzinfo=self.zone))
            try:
                back = self.decode_downstream(self.write(start))
            except PartitionKeyError:
                back = None
            if back != start:
                raise DagDefinitionError(
                    f"{where}: {type(self).__name__} output_format {self.output_format!r} "
                    f"cannot be read back to the start of its {self.period} (a rollup or "
                    "fan-out needs it); include the fields of the period, e.g. "
                    f"{self.default_output_format!r}"
                )

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "timezone": timezone_name(self.zone),
            "input_format": self.input_format,
            "output_format": self.output_format,
        }

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        zone, input_format, output_format = (
            data.get(name) for name in ("timezone", "input_format", "output_format")
        )
        if not (isinstance(zone, str) and isinstance(input_format, str)):
            raise ValueError(f"stored {cls.__name__} needs timezone and formats, got {data!r}")
        if not isinstance(output_format, str):
            raise ValueError(f"stored {cls.__name__} needs an output_format, got {data!r}")
        return cls(timezone=zone, input_format=input_format, output_format=output_format)


def _midnight(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)


class StartOfHourMapper(TemporalMapper):
    """A date key to its hour: ``2026-03-10T09:42:15`` -> ``2026-03-10T09``."""

    json_type = "start_of_hour"
    period = "hour"
    default_output_format = "%Y-%m-%dT%H"

    def start_of(self, moment: datetime) -> datetime:
        return moment.replace(minute=0, second=0, microsecond=0, fold=0)


class StartOfDayMapper(TemporalMapper):
    """A date key to its day: ``2026-03-10T09:42:15`` -> ``2026-03-10``."""

    json_type = "start_of_day"
    period = "day"
    default_output_format = "%Y-%m-%d"

    def start_of(self, moment: datetime) -> datetime:
        return _midnight(moment)


class StartOfWeekMapper(TemporalMapper):
    """A date key to the Monday of its ISO week: ``2026-03-12T09:42:15`` ->
    ``2026-03-09 (W11)``."""

    json_type = "start_of_week"
    period = "week"
    default_output_format = "%Y-%m-%d (W%V)"

    def start_of(self, moment: datetime) -> datetime:
        monday = moment.replace(tzinfo=None) - timedelta(days=moment.weekday())
        return _midnight(monday.replace(tzinfo=moment.tzinfo))


class StartOfMonthMapper(TemporalMapper):
    """A date key to its month: ``2026-03-10T09:42:15`` -> ``2026-03``."""

    json_type = "start_of_month"
    period = "month"
    default_output_format = "%Y-%m"

    def start_of(self, moment: datetime) -> datetime:
        return _midnight(moment.replace(day=1))


class StartOfQuarterMapper(TemporalMapper):
    """A date key to its calendar quarter: ``2026-03-10T09:42:15`` -> ``2026-Q1``
    (``{quarter}`` in ``output_format`` is the quarter's number)."""

    json_type = "start_of_quarter"
    period = "quarter"
    default_output_format = "%Y-Q{quarter}"

    def start_of(self, moment: datetime) -> datetime:
        return _midnight(moment.replace(month=3 * ((moment.month - 1) // 3) + 1, day=1))


class StartOfYearMapper(TemporalMapper):
    """A date key to its year: ``2026-03-10T09:42:15`` -> ``2026``."""

    json_type = "start_of_year"
    period = "year"
    default_output_format = "%Y"

    def start_of(self, moment: datetime) -> datetime:
        return _midnight(moment.replace(month=1, day=1))


#: a period's mapper, for FanOutMapper's default downstream mapper
MAPPER_OF_PERIOD: Final[Mapping[str, type[TemporalMapper]]] = {
    kind.period: kind
    for kind in (
        StartOfHourMapper,
        StartOfDayMapper,
        StartOfWeekMapper,
        StartOfMonthMapper,
        StartOfQuarterMapper,
        StartOfYearMapper,
    )
}
