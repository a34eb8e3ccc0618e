"""Waiting on conditions in async tests (never a fixed sleep-and-hope)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable


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
