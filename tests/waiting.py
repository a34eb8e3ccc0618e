"""Waiting on conditions in tests (never a fixed sleep-and-hope): async (``wait_until``,
``eventually``) and in a plain thread (``wait_for``, ``listening``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Awaitable, Callable


async def wait_until(
    predicate: Callable[[], Any], *, within: float = 10.0, step: float = 0.01
) -> Any:
    """Re-check ``predicate`` every ``step`` s until it is truthy; fail after ``within`` s."""
    with anyio.fail_after(within):
        while True:
            value = predicate()
            if value:
                return value
            await anyio.sleep(step)


async def eventually(
    check: Callable[[], Awaitable[Any]], *, within: float = 10.0, step: float = 0.02
) -> Any:
    """Await ``check()`` every ``step`` s until it is truthy; fail after ``within`` s.

    For conditions that need I/O to observe (a database row, a broker's committed offset).
    """
    with anyio.fail_after(within):
        while True:
            value = await check()
            if value:
                return value
            await anyio.sleep(step)


def wait_for(
    condition: Callable[[], object], *, timeout: float, what: str, step: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def listening(
    answers: Callable[[], bool],
    *,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    step: float = 0.05,
) -> bool:
    """Whether a server started (``answers()`` became true) within ``timeout``; False as soon
    as its process ``proc`` exited, or at the timeout. The caller says what is missing."""
    try:
        return bool(
            wait_for(
                lambda: answers() or (proc is not None and proc.poll() is not None),
                timeout=timeout,
                what="a server to accept clients",
                step=step,
            )
            and answers()
        )
    except AssertionError:
        return False
