"""``EventsTimetable`` (Airflow's): runs at listed moments, for truly irregular schedules
(sporting events, release days)::

    with DAG("match_day", schedule=EventsTimetable(
        event_dates=[pendulum.datetime(2026, 3, 14, 15, tz="Europe/London"), ...],
        restrict_to_events=True,
        description="Home matches",
    ), start_date=..., catchup=False):
        ...

Each event is one run: logical_date = run_after = the event, with a zero-length data
interval. Duplicate events are one run. The scheduler goes through the events in order
after the last scheduled run, within ``start_date`` / ``end_date``; with ``catchup=False``,
events already past are not run (as in Airflow, "past" is read when the next run is
computed). A manual run covers the moment it is started, or with ``restrict_to_events=True``
the most recent event before it (the first event when all are still to come). Backfill
runs the events within its range.
"""

from __future__ import annotations

import bisect
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engine.authoring.cron import as_utc
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.timetables import DagRunInfo, DataInterval, TimeRestriction, Timetable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ("EventsTimetable",)


def _event(where: str, value: object) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise DagDefinitionError(
            f"{where}: EventsTimetable event_dates must be aware datetimes (with a time "
            f"zone: pendulum.datetime(..., tz=...) or datetime(..., tzinfo=...)), got {value!r}"
        )
    return as_utc(value, "event date")


class EventsTimetable(Timetable):
    """Runs at each of ``event_dates`` (aware datetimes; finite: the list is stored whole).

    ``restrict_to_events``: a manual run takes the most recent event as its logical date
    instead of the moment it starts. ``presorted`` says the dates are in ascending order
    already (they are sorted otherwise). ``description`` is the name shown for the schedule;
    by default ``"N events"``.
    """

    json_type = "events"

    def __init__(
        self,
        event_dates: Iterable[datetime],
        restrict_to_events: bool = False,
        presorted: bool = False,
        description: str | None = None,
    ) -> None:
        where = caller_location()
        if isinstance(event_dates, str | bytes) or not hasattr(event_dates, "__iter__"):
            raise DagDefinitionError(
                f"{where}: EventsTimetable event_dates must be a list of datetimes, got "
                f"{event_dates!r}"
            )
        for name, flag in (("restrict_to_events", restrict_to_events), ("presorted", presorted)):
            if not isinstance(flag, bool):
                raise DagDefinitionError(f"{where}: EventsTimetable {name} must be a bool")
        if description is not None and not isinstance(description, str):
            raise DagDefinitionError(f"{where}: EventsTimetable description must be a str")
        dates = [_event(where, value) for value in event_dates]
        if not presorted:
            dates.sort()
        #: the events, ascending, each once (duplicates are one run)
        self.event_dates: list[datetime] = [
            d for i, d in enumerate(dates) if i == 0 or d != dates[i - 1]
        ]
        self.restrict_to_events = restrict_to_events
        self.presorted = presorted
        self._given_description = description
        if description is not None:
            self.summary = self.description = description
        elif self.event_dates:
            first, last = self.event_dates[0], self.event_dates[-1]
            self.summary = f"{len(self.event_dates)} events"
            self.description = f"{len(self.event_dates)} events between {first} and {last}"
        else:
            self.summary, self.description = "0 events", "No events"

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        earliest = restriction.earliest
        if not restriction.catchup:
            now = as_utc(now, "now")
            earliest = now if earliest is None else max(earliest, now)
        last = last_automated_data_interval
        for event in self.event_dates:
            if earliest is not None and event < earliest:
                continue
            if last is not None and event <= last.end:
                continue
            if restriction.latest is not None and event > restriction.latest:
                return None
            return DagRunInfo.exact(event)
        return None

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        at = as_utc(run_after, "run_after")
        if not self.restrict_to_events or not self.event_dates:
            return DataInterval(at, at)
        index = bisect.bisect_right(self.event_dates, at)
        event = self.event_dates[max(index - 1, 0)]
        return DataInterval(event, event)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        low, high = restriction.bounds(as_utc(start, "start"), as_utc(end, "end"))
        return [DagRunInfo.exact(event) for event in self.event_dates if low <= event <= high]

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "event_dates": [event.isoformat() for event in self.event_dates],
            "restrict_to_events": self.restrict_to_events,
            "description": self._given_description,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EventsTimetable:
        """The timetable ``serialize`` stored; ValueError on bad data."""
        dates = data.get("event_dates")
        if not isinstance(dates, list) or not all(isinstance(d, str) for d in dates):
            raise ValueError(f"event_dates must be a list of ISO strings, got {dates!r}")
        restrict, description = data.get("restrict_to_events"), data.get("description")
        if not isinstance(restrict, bool):
            raise ValueError(f"restrict_to_events must be a bool, got {restrict!r}")
        if description is not None and not isinstance(description, str):
            raise ValueError(f"description must be a string or null, got {description!r}")
        return cls(
            [datetime.fromisoformat(d) for d in dates],
            restrict_to_events=restrict,
            presorted=True,
            description=description,
        )
