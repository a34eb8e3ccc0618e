"""The retry rule of a failed task try, Airflow's: ``retry_delay``,
``retry_exponential_backoff`` and ``max_retry_delay``. Pure: no SQL, no clock (``now`` is an
argument).

A failed try with tries left is ``up_for_retry`` until ``retry_at``, else ``failed``. Two
parts decide it and must agree: the executor for a try that failed or whose process died
(``engine.executor.outcomes``), the scheduler for a try whose executor died
(``engine.scheduler.orphans``). They never import each other, so the rule is a leaf below
both.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta
from typing import Final

#: Airflow's ``[core] max_task_retry_delay``: an exponential backoff waits at most a day.
MAX_BACKOFF_S: Final = 24 * 60 * 60
#: Past this many doublings any retry delay is over ``MAX_BACKOFF_S`` (keeps floats finite).
_MAX_DOUBLINGS: Final = 64


def retry_wait_s(
    *,
    delay_s: float,
    exponential_backoff: bool,
    max_delay_s: float | None,
    try_number: int,
    key: str,
) -> float:
    """Seconds a failed try waits before the next one, by Airflow's rule.

    Without backoff: ``retry_delay`` (``max_retry_delay`` does not apply, as in Airflow).
    With it, after try ``n``: a base of ``retry_delay * 2 ** (n - 1)`` rounded up to whole
    seconds (at least 1), plus a jitter in ``[0, base)`` that ``key`` (the task instance and
    try) fixes, so tasks failing together spread out and the same try always gets the same
    wait; at most ``MAX_BACKOFF_S``, then at most ``max_retry_delay``.
    """
    if not exponential_backoff:
        return delay_s
    doublings = min(max(try_number - 1, 0), _MAX_DOUBLINGS)
    base = max(math.ceil(delay_s * 2.0**doublings), 1)
    if base >= MAX_BACKOFF_S:
        wait = float(MAX_BACKOFF_S)
    else:
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        wait = float(min(base + int.from_bytes(digest, "big") % base, MAX_BACKOFF_S))
    return wait if max_delay_s is None else min(wait, max_delay_s)


def next_try_at(
    *,
    dag_id: str,
    task_id: str,
    run_id: str,
    try_number: int,
    max_tries: int,
    delay_s: float,
    exponential_backoff: bool,
    max_delay_s: float | None,
    now: datetime,
) -> tuple[datetime, float] | None:
    """When try ``try_number``, failed at ``now``, is followed by the next: ``(retry_at,
    wait_s)``; None when it was the last (``try_number > max_tries``): the task fails."""
    if try_number > max_tries:
        return None
    wait_s = retry_wait_s(
        delay_s=delay_s,
        exponential_backoff=exponential_backoff,
        max_delay_s=max_delay_s,
        try_number=try_number,
        key=f"{dag_id}#{task_id}#{run_id}#{try_number}",
    )
    try:
        return now + timedelta(seconds=wait_s), wait_s
    except OverflowError:  # a retry_delay of centuries: as late as a datetime goes
        return datetime.max.replace(tzinfo=UTC), wait_s
