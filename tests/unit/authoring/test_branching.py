"""Branching in the task process: which tasks a branch, a short circuit and a latest-only
task skip (``engine.authoring.branching``), how the task process reports them
(``TaskResult.skip_task_ids``) and how the executor's decision carries them."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

import engine
from engine import DAG, EmptyOperator, TaskGroup, task
from engine.authoring import branching
from engine.authoring.branching import (
    BaseBranchOperator,
    BranchPythonOperator,
    LatestOnlyOperator,
    ShortCircuitOperator,
    branch_skips,
    downstream_task_ids,
    is_latest_run,
    skip_tasks,
    skipped_task_ids,
)
from engine.authoring.dag import take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.db.queries.tasks import TaskRun
from engine.exceptions import AirflowException
from engine.execution.context import DagRun, hydrate_context
from engine.execution.protocol import TaskResult, TaskSpec
from engine.execution.task_runner import run_task
from engine.executor.outcomes import Decision, decide_outcome
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

D = datetime(2026, 3, 10, tzinfo=UTC)  # a midnight: a daily tick


@pytest.fixture(autouse=True)
def _no_registered_dags() -> Iterator[None]:
    """The DAGs built here must not reach the DAG file a test loads in the task process."""
    take_registered_dags()
    yield
    take_registered_dags()


def _context(op: Any, **run: Any) -> dict[str, Any]:
    raw = {"dag_id": op.dag.dag_id, "run_id": "r", "task_id": op.task_id, "run": run}
    return hydrate_context(raw, op)


# --- the branch decision ------------------------------------------------------------------------


@pytest.fixture
def diamond():
    """branch >> [a, b, join], a >> join, b >> b2, and a group g (g.x >> g.y) after branch."""
    with DAG("diamond") as dag:
        branch = EmptyOperator(task_id="branch")
        a, b, b2 = (EmptyOperator(task_id=t) for t in ("a", "b", "b2"))
        join = EmptyOperator(task_id="join")
        with TaskGroup("g") as group:
            x, y = EmptyOperator(task_id="x"), EmptyOperator(task_id="y")
            x >> y
        branch >> [a, b, join]
        branch >> group
        a >> join
        b >> b2
        EmptyOperator(task_id="elsewhere")
    return dag, branch


@pytest.mark.parametrize(
    ("returned", "skipped"),
    [
        ("a", ["b", "g.x"]),  # join is downstream of a: the empty branch is kept
        (["a", "b"], ["g.x"]),
        (("b",), ["a", "g.x", "join"]),
        ("join", ["a", "b", "g.x"]),
        ("g", ["a", "b", "join"]),  # a task group follows its root tasks
        ("g.x", ["a", "b", "join"]),
        (None, ["a", "b", "g.x", "join"]),
        ([], ["a", "b", "g.x", "join"]),
        (["a", "b", "g", "join"], []),
    ],
)
def test_a_branch_skips_the_direct_downstream_tasks_it_does_not_follow(
    diamond, returned: object, skipped: list[str]
) -> None:
    _, branch = diamond
    assert branch_skips(branch, returned) == skipped


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ("b2", "task 'b2' is not directly downstream of it"),
        ("elsewhere", "task 'elsewhere' is not directly downstream of it"),
        ("g.y", "task 'g.y' is not directly downstream of it"),
        ("nope", "'nope' is not a task or task group of DAG 'diamond'"),
        (["a", "nope"], "'nope' is not a task or task group"),
    ],
)
def test_a_branch_to_a_task_that_is_not_directly_downstream_fails(
    diamond, returned: object, problem: str
) -> None:
    _, branch = diamond
    with pytest.raises(AirflowException) as caught:
        branch_skips(branch, returned)
    message = str(caught.value)
    assert problem in message
    assert "branch task 'branch' returned" in message
    assert "['a', 'b', 'g.x', 'join']" in message  # the choices


@pytest.mark.parametrize("returned", [1, {"a": 1}, ["a", 2], b"a", object()])
def test_a_branch_must_return_ids(diamond, returned: object) -> None:
    _, branch = diamond
    with pytest.raises(AirflowException, match="must return a task id, a list of task ids or None"):
        branch_skips(branch, returned)


def test_a_group_without_a_root_directly_downstream_fails() -> None:
    with DAG("groups"):
        branch, before = EmptyOperator(task_id="branch"), EmptyOperator(task_id="before")
        with TaskGroup("g") as group:
            EmptyOperator(task_id="x")
        branch >> before >> group
    with pytest.raises(AirflowException, match="no root task of task group 'g' is directly"):
        branch_skips(branch, "g")


def test_downstream_task_ids(diamond) -> None:
    dag, branch = diamond
    assert downstream_task_ids(branch, recursive=False) == {"a", "b", "join", "g.x"}
    assert downstream_task_ids(branch, recursive=True) == {"a", "b", "b2", "join", "g.x", "g.y"}
    assert downstream_task_ids(dag.get_task("b2"), recursive=True) == set()


def test_skips_are_recorded_once_and_reported_sorted() -> None:
    context: dict[str, Any] = {}
    assert skipped_task_ids(context) == []
    skip_tasks(context, ["c", "a"])
    skip_tasks(context, ["a", "b"])
    assert skipped_task_ids(context) == ["a", "b", "c"]


# --- operators and decorators -------------------------------------------------------------------


def test_branch_python_operator_follows_its_callable_and_returns_its_choice() -> None:
    with DAG("classic"):
        branch = BranchPythonOperator(
            task_id="branch", python_callable=lambda params: params["go"], params={"go": "left"}
        )
        branch >> [EmptyOperator(task_id="left"), EmptyOperator(task_id="right")]
    context = _context(branch)
    assert branch.execute(context) == "left"
    assert skipped_task_ids(context) == ["right"]
    assert isinstance(branch, BaseBranchOperator)


def test_task_branch_decorator_bare_and_with_arguments() -> None:
    with DAG("decorated"):

        @task.branch
        def pick(which: str) -> list[str]:
            return [which]

        @task.branch(task_id="chooser", retries=2)
        def pick_none() -> None:
            return None

        first, second = pick("one"), pick_none()
        first >> [EmptyOperator(task_id="one"), EmptyOperator(task_id="two")]
        second >> EmptyOperator(task_id="three")
        third = pick.override(task_id="again")("two")
        third >> [EmptyOperator(task_id="four")]
    assert isinstance(first, BranchPythonOperator) and first.task_id == "pick"
    assert isinstance(second, BranchPythonOperator)
    assert (second.task_id, second.retries) == ("chooser", 2)
    assert isinstance(third, BranchPythonOperator) and third.task_id == "again"
    context = _context(first)
    assert first.execute(context) == ["one"]
    assert skipped_task_ids(context) == ["two"]
    context = _context(second)
    assert second.execute(context) is None
    assert skipped_task_ids(context) == ["three"]
    with pytest.raises(AirflowException, match="'two', but task 'two' is not directly"):
        third.execute(_context(third))


def test_a_custom_branch_operator_implements_choose_branch() -> None:
    class Weekday(BaseBranchOperator):
        def choose_branch(self, context: Any) -> str:
            return "weekday" if context["logical_date"].weekday() < 5 else "weekend"

    with DAG("custom"):
        op = Weekday(task_id="which")
        op >> [EmptyOperator(task_id="weekday"), EmptyOperator(task_id="weekend")]
    context = _context(op, logical_date=D)  # a Tuesday
    assert op.execute(context) == "weekday"
    assert skipped_task_ids(context) == ["weekend"]


def _short_circuit(condition: object, **kwargs: Any) -> ShortCircuitOperator:
    """check >> a >> [b, c] (c: all_done), check >> d, and an unrelated task."""
    with DAG("short"):
        check = ShortCircuitOperator(task_id="check", python_callable=lambda: condition, **kwargs)
        a, b = EmptyOperator(task_id="a"), EmptyOperator(task_id="b")
        c = EmptyOperator(task_id="c", trigger_rule="all_done")
        check >> a >> [b, c]
        check >> EmptyOperator(task_id="d")
        EmptyOperator(task_id="unrelated")
    return check


@pytest.mark.parametrize("condition", [True, 1, "yes", [0]])
def test_a_truthy_short_circuit_skips_nothing(condition: object) -> None:
    check = _short_circuit(condition)
    context = _context(check)
    assert check.execute(context) == condition
    assert skipped_task_ids(context) == []


@pytest.mark.parametrize("condition", [False, None, 0, "", []])
def test_a_falsy_short_circuit_skips_everything_downstream(condition: object) -> None:
    check = _short_circuit(condition)
    context = _context(check)
    assert check.execute(context) == condition
    assert skipped_task_ids(context) == ["a", "b", "c", "d"]


def test_a_short_circuit_that_respects_trigger_rules_skips_the_direct_tasks_only() -> None:
    check = _short_circuit(False, ignore_downstream_trigger_rules=False)
    context = _context(check)
    check.execute(context)
    assert skipped_task_ids(context) == ["a", "d"]


def test_task_short_circuit_decorator() -> None:
    with DAG("decorated_short"):

        @task.short_circuit(ignore_downstream_trigger_rules=False)
        def is_ready(n: int) -> bool:
            return n > 3

        @task.short_circuit
        def never() -> bool:
            return False

        ready, no = is_ready(2), never()
        ready >> EmptyOperator(task_id="a") >> EmptyOperator(task_id="b")
        no >> EmptyOperator(task_id="c") >> EmptyOperator(task_id="e")
    assert isinstance(ready, ShortCircuitOperator) and not ready.ignore_downstream_trigger_rules
    assert isinstance(no, ShortCircuitOperator) and no.ignore_downstream_trigger_rules
    context = _context(ready)
    assert ready.execute(context) is False
    assert skipped_task_ids(context) == ["a"]
    context = _context(no)
    no.execute(context)
    assert skipped_task_ids(context) == ["c", "e"]


def test_short_circuit_argument_is_checked() -> None:
    with DAG("bad"), pytest.raises(DagDefinitionError, match="ignore_downstream_trigger_rules"):
        ShortCircuitOperator(
            task_id="c", python_callable=bool, ignore_downstream_trigger_rules="no"
        )


def test_the_names_are_exported() -> None:
    for name in ("BranchPythonOperator", "ShortCircuitOperator", "LatestOnlyOperator"):
        assert getattr(engine, name) is getattr(branching, name)
        assert name in engine.__all__
    assert "BaseBranchOperator" in engine.__all__
    assert task.branch is branching.branch_task  # type: ignore[attr-defined]
    assert task.short_circuit is branching.short_circuit_task  # type: ignore[attr-defined]


# --- latest only --------------------------------------------------------------------------------


def _run(run_type: str, at: datetime | None, *, interval: timedelta = timedelta(0)) -> DagRun:
    return DagRun(
        dag_id="d",
        run_id="r",
        run_type=run_type,
        logical_date=None if at is None else at - interval,
        data_interval_start=None if at is None else at - interval,
        data_interval_end=at,
        run_after=at,
    )


def _dag(schedule: object, **kwargs: Any) -> DAG:
    return DAG("latest", schedule=schedule, start_date=datetime(2026, 1, 1, tzinfo=UTC), **kwargs)


HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@pytest.mark.parametrize(
    ("run_type", "at", "now", "latest"),
    [
        ("scheduled", D, D, True),  # the interval just ended: the latest run
        ("scheduled", D, D + 23 * HOUR, True),
        ("scheduled", D, D + DAY, False),  # the next tick has come: another run is the latest
        ("scheduled", D, D + 30 * DAY, False),
        ("scheduled", D, D - HOUR, False),  # before its own interval ended
        ("backfill", D, D + 30 * DAY, False),
        ("backfill", D, D + HOUR, True),
        ("manual", D, D + 30 * DAY, True),
        ("asset_triggered", None, D + 30 * DAY, True),
        ("scheduled", None, D, True),  # no interval to compare
    ],
)
def test_latest_run_of_a_daily_cron(run_type: str, at: Any, now: datetime, latest: bool) -> None:
    dag = _dag("@daily")
    assert is_latest_run(dag, _run(run_type, at), now=now) is latest


def test_latest_run_of_data_intervals_is_the_last_complete_one() -> None:
    from engine import CronDataIntervalTimetable

    dag = _dag(CronDataIntervalTimetable("0 0 * * *", timezone="UTC"))
    run = _run("scheduled", D, interval=DAY)  # covers the day before D, runs at D
    assert is_latest_run(dag, run, now=D + 12 * HOUR)
    assert not is_latest_run(dag, run, now=D + DAY + HOUR)


def test_latest_run_of_a_delta_schedule() -> None:
    dag = _dag(timedelta(hours=6))
    at = datetime(2026, 1, 1, 18, tzinfo=UTC)
    assert is_latest_run(dag, _run("scheduled", at), now=at + 5 * HOUR)
    assert not is_latest_run(dag, _run("scheduled", at), now=at + 6 * HOUR)


def test_runs_without_a_periodic_schedule_and_the_last_run_are_the_latest() -> None:
    far = D + 365 * DAY
    assert is_latest_run(_dag(None), _run("scheduled", D), now=far)
    assert is_latest_run(_dag("@once"), _run("scheduled", D), now=far)
    assert is_latest_run(None, _run("scheduled", D), now=far)
    ended = _dag("@daily", end_date=D + HOUR)  # no run after D
    assert is_latest_run(ended, _run("scheduled", D), now=far)


@pytest.mark.parametrize(("now", "skipped"), [(D + HOUR, []), (D + 2 * DAY, ["a", "b"])])
def test_latest_only_operator_skips_its_direct_downstream_tasks_when_behind(
    monkeypatch: pytest.MonkeyPatch, now: datetime, skipped: list[str]
) -> None:
    monkeypatch.setattr(branching, "_utcnow", lambda: now)
    with _dag("@daily"):
        latest = LatestOnlyOperator(task_id="latest_only")
        latest >> [EmptyOperator(task_id="a"), EmptyOperator(task_id="b")]
    run = {"run_type": "scheduled", "logical_date": D, "data_interval_start": D}
    context = _context(latest, **run, data_interval_end=D, run_after=D)
    returned = latest.execute(context)
    assert skipped_task_ids(context) == skipped
    assert returned == ([] if skipped else ["a", "b"])


# --- the task process reports the skips; the executor's decision carries them -----------------

DAG_FILE = """
from engine import DAG, EmptyOperator, task


@task.branch
def pick():
    return "left"


@task.branch
def wrong():
    return "far"


with DAG("branchy"):
    chosen = pick()
    chosen >> [EmptyOperator(task_id="left"), EmptyOperator(task_id="right")]
    bad = wrong()
    bad >> EmptyOperator(task_id="near") >> EmptyOperator(task_id="far")
"""


@pytest.fixture
def spec_for(tmp_path: Path):
    dag_file = tmp_path / "branchy.py"
    dag_file.write_text(textwrap.dedent(DAG_FILE))

    def make(task_id: str) -> TaskSpec:
        context = {"dag_id": "branchy", "run_id": "r", "task_id": task_id, "run": {}}
        return TaskSpec(
            ti_id=1,
            dag_id="branchy",
            run_id="r",
            task_id=task_id,
            fileloc=str(dag_file),
            try_number=1,
            try_started_at=datetime.now(UTC).isoformat(),
            context=dumps(context),
        )

    return make


def test_the_task_process_reports_the_skips_with_the_success(spec_for) -> None:
    result = run_task(spec_for("pick"))
    assert result.outcome == TaskState.SUCCESS
    assert result.skip_task_ids == ["right"]
    assert deserialize_value(result.return_value) == "left"
    assert TaskResult.from_json(result.to_json()) == result


def test_a_branch_to_a_task_not_directly_downstream_fails_the_try(spec_for) -> None:
    result = run_task(spec_for("wrong"))
    assert result.outcome == TaskState.FAILED and result.skip_task_ids == []
    assert result.error is not None
    assert "branch task 'wrong' returned 'far', but task 'far' is not directly downstream" in (
        result.error
    )


def _task_run() -> TaskRun:
    return TaskRun(
        ti_id=7,
        dag_id="d",
        run_id="r",
        task_id="t",
        fileloc="/dags/d.py",
        try_number=1,
        max_tries=0,
        try_started_at=D,
        next_method=None,
        next_kwargs=None,
        deferral_count=0,
        execution_timeout_s=None,
    )


def test_the_success_outcome_carries_the_skips_and_says_so() -> None:
    result = TaskResult(TaskState.SUCCESS, 0.5, skip_task_ids=["b", "c"])
    outcome = decide_outcome(
        result,
        _task_run(),
        returncode=0,
        interrupted=False,
        killed_for_timeout=False,
        wall_s=0.5,
        now=D,
    )
    assert outcome.decision is Decision.SUCCEED
    assert outcome.skip_task_ids == ("b", "c")
    assert outcome.describe() == "task succeeded; skipping b, c"
