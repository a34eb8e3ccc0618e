"""The pure parts of ``sluice db clean``: ``--before``, ``--tables``, cut-offs, the summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.cli.db_clean import (
    DESCRIPTIONS,
    LONG_DEAD_AFTER_S,
    long_dead_after_s,
    make_plan,
    parse_before,
    parse_tables,
    summary_lines,
)
from engine.db.queries.clean import TABLES

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "age"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("30d", timedelta(days=30)),
        (" 2w ", timedelta(weeks=2)),
        ("1.5d", timedelta(hours=36)),
        ("0s", timedelta(0)),
    ],
)
def test_before_as_an_age(value: str, age: timedelta) -> None:
    assert parse_before(value, now=NOW) == NOW - age


@pytest.mark.parametrize(
    ("value", "moment"),
    [
        ("2026-10-01T08:30:00+00:00", datetime(2026, 10, 1, 8, 30, tzinfo=UTC)),
        ("2026-10-01T08:30:00Z", datetime(2026, 10, 1, 8, 30, tzinfo=UTC)),
        ("2026-10-01T10:30:00+02:00", datetime(2026, 10, 1, 8, 30, tzinfo=UTC)),
        ("2026-10-01 08:30", datetime(2026, 10, 1, 8, 30, tzinfo=UTC)),  # naive: UTC
        ("2026-10-01", datetime(2026, 10, 1, tzinfo=UTC)),
    ],
)
def test_before_as_a_timestamp(value: str, moment: datetime) -> None:
    parsed = parse_before(value, now=NOW)
    assert parsed == moment
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize("value", ["", "yesterday", "30", "30y", "-1d", "2026-13-01"])
def test_before_that_is_neither_names_both_forms(value: str) -> None:
    with pytest.raises(ValueError, match=r"neither an ISO timestamp .* nor an age"):
        parse_before(value, now=NOW)


def test_before_in_the_future_is_refused() -> None:
    with pytest.raises(ValueError, match="in the future"):
        parse_before("2026-11-25T12:00:01Z", now=NOW)
    assert parse_before("2026-11-25T12:00:00Z", now=NOW) == NOW


def test_tables_default_to_all_in_cleaning_order() -> None:
    assert parse_tables(None) == parse_tables("") == TABLES
    assert TABLES[0] == "dag_run"  # runs first: deleting them frees their asset events
    assert set(DESCRIPTIONS) == set(TABLES)


def test_tables_are_put_in_cleaning_order_and_deduplicated() -> None:
    assert parse_tables(" job, dag_run ,job,") == ("dag_run", "job")


def test_unknown_table_is_named_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown table\(s\) dag, task_instance; choose from"):
        parse_tables("dag_run,task_instance,dag")


def test_cutoffs_come_from_now_the_retention_and_the_liveness_threshold() -> None:
    before = NOW - timedelta(days=1)
    plan = make_plan(
        ("asset_event",), before=before, now=NOW, dedup_retention_s=7 * 86_400, dead_after_s=10.5
    )
    assert plan.tables == ("asset_event",)
    assert plan.cutoffs.before == before
    assert plan.cutoffs.dedup_before == NOW - timedelta(days=7)
    assert plan.cutoffs.dead_before == NOW - timedelta(seconds=10.5)


def test_summary_has_one_aligned_line_per_table() -> None:
    lines = summary_lines({"dag_run": 3, "task_instance": 12}, dry_run=True)
    assert lines == [
        "dag_run        3 row(s) would be deleted",
        "task_instance  12 row(s) would be deleted",
    ]
    assert summary_lines({"job": 0}, dry_run=False) == ["job  0 row(s) deleted"]


def test_a_running_job_is_dead_for_the_clean_only_after_an_hour_or_the_thresholds() -> None:
    assert LONG_DEAD_AFTER_S == 3600.0
    assert long_dead_after_s(10.5, 10.5) == 3600.0
    assert long_dead_after_s(10.5, 7200.0) == 7200.0
