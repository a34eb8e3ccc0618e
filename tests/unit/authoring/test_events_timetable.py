"""``EventsTimetable``: the runs it gives (catchup or not, within start/end dates, after the
last run), manual runs with and without ``restrict_to_events``, backfill's range, its stored
form, and the errors for bad arguments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine import EventsTimetable
from engine.authoring.errors import DagDefinitionError
from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import DataInterval, TimeRestriction

E1, E2, E3 = (datetime(2026, 1, d, 12, tzinfo=UTC) for d in (2, 5, 9))
NOW = datetime(2026, 1, 6, tzinfo=UTC)


def _next(t: EventsTimetable, *, last=None, earliest=None, latest=None, catchup=True):
    info = t.next_dagrun_info(
        last_automated_data_interval=last,
        restriction=TimeRestriction(earliest, latest, catchup),
        now=NOW,
    )
    return None if info is None else info.logical_date


def test_events_are_sorted_once_each_and_described() -> None:
    t = EventsTimetable([E3, E1, E2, E1])
    assert t.event_dates == [E1, E2, E3]
    assert t.summary == "3 events"
    assert t.description == f"3 events between {E1} and {E3}"
    named = EventsTimetable([E1], description="Match days")
    assert (named.summary, named.description) == ("Match days", "Match days")
    assert EventsTimetable([]).description == "No events"


def test_the_next_run_is_the_first_event_after_the_last_run() -> None:
    t = EventsTimetable([E1, E2, E3])
    assert _next(t) == E1
    assert _next(t, last=DataInterval(E1, E1)) == E2
    assert _next(t, last=DataInterval(E3, E3)) is None
    assert _next(t, earliest=E1 + timedelta(hours=1)) == E2
    assert _next(t, latest=E1 + timedelta(hours=1), last=DataInterval(E1, E1)) is None
    info = t.next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(None, None, True),
        now=NOW,
    )
    assert info is not None
    assert info.data_interval == DataInterval(E1, E1) and info.run_after == E1


def test_without_catchup_past_events_are_skipped() -> None:
    assert _next(EventsTimetable([E1, E2, E3]), catchup=False) == E3


def test_a_manual_run_covers_now_or_with_restrict_to_events_the_latest_event() -> None:
    assert EventsTimetable([E1, E2]).infer_manual_data_interval(run_after=NOW) == DataInterval(
        NOW, NOW
    )
    restricted = EventsTimetable([E1, E2, E3], restrict_to_events=True)
    assert restricted.infer_manual_data_interval(run_after=NOW) == DataInterval(E2, E2)
    early = E1 - timedelta(days=1)
    assert restricted.infer_manual_data_interval(run_after=early) == DataInterval(E1, E1)


def test_backfill_runs_the_events_in_its_range() -> None:
    t = EventsTimetable([E1, E2, E3])
    runs = t.runs_between(E1, E2, restriction=TimeRestriction(None, None, False))
    assert [r.logical_date for r in runs] == [E1, E2]


def test_it_is_stored_and_read_back_equal() -> None:
    t = EventsTimetable([E2, E1], restrict_to_events=True, description="d")
    assert timetable_from_json(t.serialize()) == t
    assert timetable_from_json(t.serialize()).restrict_to_events is True


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"event_dates": [datetime(2026, 1, 1)]}, "must be aware datetimes"),
        ({"event_dates": "2026-01-01"}, "must be a list of datetimes"),
        ({"event_dates": [E1], "restrict_to_events": "yes"}, "restrict_to_events must be a bool"),
        ({"event_dates": [E1], "description": 3}, "description must be a str"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match) -> None:
    with pytest.raises(DagDefinitionError, match=match):
        EventsTimetable(**kwargs)
