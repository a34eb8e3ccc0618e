"""Retry policies, the pure parts: which rule matches which exception, what the task
process reports for each action, and what the executor makes of it with the task's
retries (``retries`` bounds a policy's RETRY; its delay replaces the task's rule)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from engine import (
    ExceptionRetryPolicy,
    RetryAction,
    RetryDecision,
    RetryPolicy,
    RetryRule,
    task,
)
from engine.authoring.dag import DAG, take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.db.queries.tasks import TaskRun
from engine.execution.protocol import TaskResult
from engine.execution.retry_decisions import PolicyVerdict, ask_retry_policy
from engine.executor.outcomes import Decision, decide_outcome
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Iterator

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class Throttled(ConnectionError):
    pass


@pytest.fixture(autouse=True)
def _no_registered_dags() -> Iterator[None]:
    yield
    take_registered_dags()


def _task(policy: RetryPolicy | None, retries: int = 3) -> Any:
    @task(retries=retries, retry_policy=policy)
    def work() -> None:
        return None

    with DAG("d"):
        return work()


POLICY = ExceptionRetryPolicy(
    rules=[
        RetryRule(exception=[TimeoutError, "builtins.KeyError"], retry_delay=timedelta(seconds=7)),
        RetryRule(exception=ConnectionError, action=RetryAction.FAIL, match_subclasses=False),
        RetryRule(exception=OSError, action=RetryAction.FAIL, reason="disk"),
    ]
)


@pytest.mark.parametrize(
    ("exc", "decision"),
    [
        (
            TimeoutError(),
            RetryDecision.retry(timedelta(seconds=7), "Matched rule for TimeoutError"),
        ),
        (KeyError("k"), RetryDecision.retry(timedelta(seconds=7), "Matched rule for KeyError")),
        (ConnectionError(), RetryDecision.fail("Matched rule for ConnectionError")),
        # a subclass skips the exact-type rule and falls to the next that matches
        (Throttled(), RetryDecision.fail("disk")),
        (ValueError(), RetryDecision.default()),
    ],
)
def test_the_first_matching_rule_decides(exc: BaseException, decision: RetryDecision) -> None:
    assert POLICY.evaluate(exc, 1, 3) == decision


def test_the_default_action_applies_when_no_rule_matches() -> None:
    policy = ExceptionRetryPolicy(rules=[], default=RetryAction.FAIL)
    assert policy.evaluate(ValueError(), 1, 3).action is RetryAction.FAIL


@pytest.mark.parametrize("spec", ["ValueError", "", "a..b", 42, int])
def test_a_rule_refuses_what_is_not_an_exception(spec: Any) -> None:
    with pytest.raises(DagDefinitionError, match="RetryRule"):
        RetryRule(exception=spec)


def test_a_path_that_does_not_import_is_logged_and_never_matches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        rule = RetryRule(exception="nowhere.to.be.Found")
    assert "does not import here" in caplog.text
    assert not rule.matches(ValueError())


def test_a_task_takes_a_policy_and_refuses_anything_else() -> None:
    assert _task(POLICY).retry_policy is POLICY
    with pytest.raises(DagDefinitionError, match="retry_policy must be a RetryPolicy"):
        _task({"rules": []})  # type: ignore[arg-type]


class Raising(RetryPolicy):
    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context=None):
        raise RuntimeError("policy bug")


class Echo(RetryPolicy):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, Any]] = []

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context=None):
        self.seen.append((try_number, max_tries, context))
        return RetryDecision.retry(timedelta(minutes=2), reason="x" * 900)


def test_the_task_process_reports_the_policys_verdict() -> None:
    ask = ask_retry_policy
    fail = ask(_task(POLICY), ConnectionError(), try_number=1, max_tries=3, context=None)
    assert fail == PolicyVerdict(fail_now=True, reason="Matched rule for ConnectionError")
    assert ask(_task(None), ValueError(), try_number=1, max_tries=3, context=None) == (
        PolicyVerdict()
    )
    assert ask(_task(Raising()), ValueError(), try_number=1, max_tries=3, context=None) == (
        PolicyVerdict()
    )
    echo = Echo()
    retry = ask(_task(echo, retries=4), ValueError(), try_number=2, max_tries=None, context={})
    assert (retry.fail_now, retry.retry_delay_s, len(retry.reason or "")) == (False, 120.0, 500)
    assert echo.seen == [(2, 4, {})]  # max_tries from the task when the spec has none


def _run(try_number: int, max_tries: int = 3) -> TaskRun:
    return TaskRun(
        ti_id=7,
        dag_id="d",
        run_id="r1",
        task_id="t",
        fileloc="/dags/d.py",
        try_number=try_number,
        max_tries=max_tries,
        try_started_at=NOW,
        next_method=None,
        next_kwargs=None,
        deferral_count=0,
        execution_timeout_s=None,
        retry_delay_s=3600.0,
        retry_exponential_backoff=True,
        max_retry_delay_s=7200.0,
    )


def _decide(run: TaskRun, **result: Any) -> Any:
    return decide_outcome(
        TaskResult(TaskState.FAILED, 0.1, error="E: x", **result),
        run,
        returncode=0,
        interrupted=False,
        killed_for_timeout=False,
        wall_s=0.1,
        now=NOW,
    )


def test_the_executor_applies_the_verdict_within_the_tasks_retries() -> None:
    failed = _decide(_run(1), no_retry=True, retry_reason="bad data")
    assert (failed.decision, failed.reason) == (Decision.FAIL, "E: x (retry policy: bad data)")
    soon = _decide(_run(1), retry_delay_s=5.0, retry_reason="blink")
    assert (soon.decision, soon.retry_wait_s) == (Decision.RETRY, 5.0)  # no backoff, no hour
    assert soon.retry_at == NOW + timedelta(seconds=5)
    standard = _decide(_run(1))
    assert standard.decision is Decision.RETRY and standard.retry_wait_s >= 3600
    # RETRY with no tries left is DEFAULT: the task fails
    assert _decide(_run(4), retry_delay_s=5.0).decision is Decision.FAIL
