"""The task's ``retry_policy`` asked about a failed try, in the task process (as Airflow:
the policy sees the exception object; the executor only its decision).

The answer travels in the ``TaskResult``: ``no_retry`` for ``FAIL``, ``retry_delay_s`` for
a ``RETRY`` with a delay, ``retry_reason`` for the log. The executor applies it with the
task's ``retries`` (``engine.executor.outcomes``): a policy never adds tries.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.authoring.retry_policies import RetryAction, RetryDecision

if TYPE_CHECKING:
    from engine.authoring.baseoperator import BaseOperator

logger = logging.getLogger(__name__)

#: a reason longer than this is cut (it goes into log lines and the callback's error text)
REASON_MAX_CHARS = 500


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    """The decision as the result carries it."""

    fail_now: bool = False
    retry_delay_s: float | None = None
    reason: str | None = None


def ask_retry_policy(
    task: BaseOperator | None,
    exception: BaseException,
    *,
    try_number: int,
    max_tries: int | None,
    context: dict[str, Any] | None,
) -> PolicyVerdict:
    """The verdict of ``task.retry_policy`` on ``exception`` (the default one without a
    policy). A policy that raises or answers something else is logged and the task's
    standard rule applies."""
    policy = getattr(task, "retry_policy", None)
    if policy is None or task is None:
        return PolicyVerdict()
    tries = task.retries if max_tries is None else max_tries
    try:
        decision = policy.evaluate(exception, try_number, tries, context)
    except Exception:
        logger.exception(
            "The retry policy of task %r raised; the standard retry rule applies",
            task.task_id,
            extra={"action": "retry_policy_error"},
        )
        return PolicyVerdict()
    if not isinstance(decision, RetryDecision):
        logger.error(
            "The retry policy of task %r returned %r, not a RetryDecision; the standard retry "
            "rule applies",
            task.task_id,
            decision,
            extra={"action": "retry_policy_error"},
        )
        return PolicyVerdict()
    return _verdict(task.task_id, decision)


def _verdict(task_id: str, decision: RetryDecision) -> PolicyVerdict:
    reason = None if decision.reason is None else str(decision.reason)[:REASON_MAX_CHARS]
    if decision.action is RetryAction.FAIL:
        logger.info("Retry policy: fail now (%s)", reason, extra={"action": "retry_policy_fail"})
        return PolicyVerdict(fail_now=True, reason=reason)
    if decision.action is RetryAction.RETRY:
        delay = decision.retry_delay
        delay_s = None if delay is None else max(delay.total_seconds(), 0.0)
        if delay_s is not None and not math.isfinite(delay_s):
            delay_s = None
        logger.info(
            "Retry policy: retry%s (%s)",
            "" if delay_s is None else f" after {delay_s:g}s",
            reason,
            extra={"action": "retry_policy_retry", "task_id": task_id},
        )
        return PolicyVerdict(retry_delay_s=delay_s, reason=reason)
    return PolicyVerdict()
