"""The scheduler's pure decisions moved out of the database layer: what a backfill does with
a date (``--reprocess``) and how a try of a dead executor ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.db.queries.backfills import REPROCESS_COMPLETED, REPROCESS_FAILED, REPROCESS_NONE
from engine.db.queries.orphans import LostTryFacts
from engine.scheduler.backfills import CREATE, REPROCESS, SKIP, decide
from engine.scheduler.orphans import lost_try

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("state", "reprocess", "action"),
    [
        (None, REPROCESS_NONE, CREATE),
        ("failed", REPROCESS_NONE, SKIP),
        ("failed", REPROCESS_FAILED, REPROCESS),
        ("success", REPROCESS_FAILED, SKIP),
        ("success", REPROCESS_COMPLETED, REPROCESS),
        ("failed", REPROCESS_COMPLETED, REPROCESS),
        ("running", REPROCESS_COMPLETED, SKIP),  # an unfinished run is never touched
        ("queued", REPROCESS_COMPLETED, SKIP),
    ],
)
def test_reprocess_decides_about_a_date_that_has_a_run(
    state: str | None, reprocess: str, action: str
) -> None:
    assert decide(state, reprocess) == action


def _facts(**changes: object) -> LostTryFacts:
    values: dict[str, object] = {
        "ti_id": 7,
        "dag_id": "d",
        "run_id": "r",
        "task_id": "t",
        "map_index": -1,
        "try_number": 1,
        "max_tries": 1,
        "executor_job_id": 3,
        "retry_delay_s": 60.0,
        "retry_exponential_backoff": False,
        "max_retry_delay_s": None,
        "hostname": "h",
        "latest_heartbeat": NOW - timedelta(minutes=10),
        **changes,
    }
    return LostTryFacts(**values)


def test_a_lost_try_with_tries_left_is_up_for_retry_after_its_delay() -> None:
    lost = lost_try(_facts(), threshold_s=300, now=NOW)
    assert (lost.state, lost.retry_at, lost.retry_wait_s) == (
        "up_for_retry",
        NOW + timedelta(seconds=60),
        60.0,
    )
    assert "executor (job 3 on h) stopped heartbeating" in lost.reason
    assert lost.log_fields()["ti_id"] == 7


def test_the_last_try_lost_fails_and_a_task_gone_from_its_dag_retries_by_default() -> None:
    assert lost_try(_facts(try_number=2), threshold_s=300, now=NOW).state == "failed"
    gone = lost_try(_facts(retry_delay_s=None, executor_job_id=None), threshold_s=300, now=NOW)
    assert gone.retry_wait_s == 300.0 and "no executor job holds it" in gone.reason
