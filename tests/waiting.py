"""Waiting on conditions in async tests (never a fixed sleep-and-hope)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
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
