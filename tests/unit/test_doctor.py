"""The doctor's rules on plain facts (what ``store_inspect.doctor_facts`` reads)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine import doctor

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
GRACE_S = 10.0


def job(
    job_id: int, kind: str, *, alive: bool = True, capacity: int | None = None, load: int = 0
) -> dict[str, Any]:
    return {
        "id": job_id,
        "type": kind,
        "alive": alive,
        "capacity": capacity,
        "load": load,
        "hostname": "h",
        "pid": 100 + job_id,
        "heartbeat_age_s": 1.0 if alive else 120.0,
    }


def healthy(triggerer_capacity: int = 10, load: int = 0) -> list[dict[str, Any]]:
    return [
        job(1, "triggerer", capacity=triggerer_capacity, load=load),
        job(2, "scheduler"),
        job(3, "executor", capacity=4),
        job(4, "dag_processor"),
    ]


def deferred(
    task: str = "t",
    *,
    trigger_id: int | None = 7,
    row: bool = True,
    owner: int | None = 1,
    created_s_ago: float = 60.0,
    timeout_in_s: float | None = None,
) -> dict[str, Any]:
    return {
        "dag_id": "d",
        "run_id": "r",
        "task_id": task,
        "trigger_id": trigger_id,
        "trigger_timeout": None if timeout_in_s is None else NOW + timedelta(seconds=timeout_in_s),
        "trigger_row": trigger_id if row else None,
        "trigger_created": NOW - timedelta(seconds=created_s_ago),
        "triggerer_id": owner,
        "last_error": None,
    }


def facts(jobs: list[dict[str, Any]], *tasks: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "jobs": jobs,
        "deferred": list(tasks),
        "failed_watchers": [],
        "failing_watchers": [],
        "parse_errors": [],
        "stream_splits": [],
        "unassigned_triggers": sum(1 for t in tasks if t["triggerer_id"] is None),
        "now": NOW,
        **more,
    }


def checks(found: list[doctor.Finding]) -> list[tuple[str, str]]:
    return [(f.check, f.severity) for f in found]


def diagnose(f: dict[str, Any]) -> list[doctor.Finding]:
    return doctor.diagnose(f, claim_grace_s=GRACE_S)


def test_a_healthy_engine_with_an_assigned_deferral_has_no_findings() -> None:
    assert diagnose(facts(healthy(), deferred())) == []


@pytest.mark.parametrize(
    ("created_s_ago", "expected"),
    [(1.0, []), (60.0, [("trigger_unclaimed", "warning")])],
    ids=["within the claim grace", "past it"],
)
def test_an_unassigned_trigger_with_spare_capacity(created_s_ago, expected) -> None:
    found = diagnose(facts(healthy(), deferred(owner=None, created_s_ago=created_s_ago)))
    assert checks(found) == expected


def test_an_unassigned_trigger_and_no_triggerer_alive() -> None:
    jobs = [j for j in healthy() if j["type"] != "triggerer"]
    found = diagnose(facts(jobs, deferred(owner=None)))
    assert checks(found) == [("live_triggerer", "error"), ("trigger_unassigned", "error")]
    assert "no triggerer is alive" in found[1].problem
    assert "sluice triggerer" in found[1].action


@pytest.mark.parametrize(
    ("overdue_s", "severity"), [(5.0, "warning"), (120.0, "error")], ids=["just", "long ago"]
)
def test_a_deferral_past_its_timeout(overdue_s, severity) -> None:
    found = diagnose(facts(healthy(), deferred(timeout_in_s=-overdue_s)))
    assert checks(found) == [("deferral_timeout", severity)]
    assert "task d/r/t (trigger 7)" in found[0].problem


def test_a_missing_trigger_row() -> None:
    found = diagnose(facts(healthy(), deferred(row=False)))
    assert checks(found) == [("trigger_missing", "error")]
    assert "sluice dags trigger d" in found[0].action


def test_a_dead_owner_while_the_live_triggerers_are_full() -> None:
    jobs = [*healthy(triggerer_capacity=1, load=1), job(5, "triggerer", alive=False)]
    found = diagnose(facts(jobs, deferred(owner=5)))
    assert ("trigger_owner_dead", "error") in checks(found)
    owner = next(f for f in found if f.check == "trigger_owner_dead")
    assert "every live triggerer is at capacity" in owner.problem
    assert "[triggerer] capacity" in owner.action
    assert ("dead_job", "warning") in checks(found)


def test_a_long_dead_job_is_no_longer_reported() -> None:
    gone = job(5, "scheduler", alive=False)
    gone["heartbeat_age_s"] = doctor.DEAD_JOB_WINDOW_S + 1
    assert diagnose(facts([*healthy(), gone])) == []


def test_many_findings_of_one_check_are_summed_up() -> None:
    jobs = [*healthy(), job(5, "triggerer", alive=False)]
    tasks = [deferred(f"t{n}", trigger_id=100 + n, owner=5) for n in range(12)]
    found = [f for f in diagnose(facts(jobs, *tasks)) if f.check == "trigger_owner_dead"]
    assert len(found) == doctor.MAX_FINDINGS_PER_CHECK + 1
    assert found[-1].problem == f"{12 - doctor.MAX_FINDINGS_PER_CHECK} more like the above"
    assert found[-1].severity == "warning"  # survivors have spare capacity: they take over


def test_a_long_error_is_cut_to_its_first_line() -> None:
    error = "x" * 400 + "\nTraceback ..."
    found = diagnose(facts(healthy(), parse_errors=[{"file": "/d.py", "line": 3, "error": error}]))
    assert checks(found) == [("dag_parse_error", "error")]
    assert found[0].problem.endswith("x" * 297 + "...") and "Traceback" not in found[0].problem
    assert doctor.has_errors(found)


def test_a_shared_stream_group_split_across_live_triggerers_is_an_error() -> None:
    split = {"digest": "ab" * 32, "holders": {7: 3, 9: 1}, "trigger_ids": [1, 2, 3, 4]}
    found = diagnose(facts([], stream_splits=[split]))
    assert ("stream_split", "error") in checks(found)
    [finding] = [f for f in found if f.check == "stream_split"]
    assert "1, 2, 3, 4" in finding.problem and "7: 3 trigger(s)" in finding.problem
