"""The local executor's claim loop against a scripted claim and supervisor (no database):
which slots it fills, and when it waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from engine.db.queries.pools import Candidate
from engine.executor.local import LocalExecutor
from engine.executor.settings import ExecutorSettings
from tests.waiting import wait_until


class ScriptedSteps:
    """Claims hand out the next ids of a backlog; each step runs until released."""

    def __init__(self, backlog: int) -> None:
        self.backlog = list(range(1, backlog + 1))
        self.claims: list[int] = []  # how many each claim asked for
        self.ends: dict[int, anyio.Event] = {}
        self.in_claim = anyio.Event()
        self.release_claim = anyio.Event()
        self.hold_claim_number: int | None = None

    async def claim(self, job_id: int, free: int) -> list[Candidate]:
        self.claims.append(free)
        if len(self.claims) == self.hold_claim_number:
            self.in_claim.set()
            await self.release_claim.wait()
        taken, self.backlog = self.backlog[:free], self.backlog[free:]
        return [Candidate(ti_id, 1, "d", f"t{ti_id}", "default_pool", 1, 16) for ti_id in taken]

    async def execute(self, job_id: int, ti_id: int, claimed: Candidate | None = None) -> None:
        await self.ends.setdefault(ti_id, anyio.Event()).wait()

    def end(self, ti_id: int) -> None:
        self.ends.setdefault(ti_id, anyio.Event()).set()


def _executor(steps: ScriptedSteps, parallelism: int) -> LocalExecutor:
    settings = ExecutorSettings(
        parallelism=parallelism,
        dags_folder=Path("."),
        plugins_folder=None,
        task_log_folder=Path("."),
        poll_interval_s=3600.0,  # only a nudge or a freed slot may start a claim
    )
    executor = LocalExecutor(db=Any, cipher=Any, settings=settings)  # type: ignore[arg-type]
    executor._claim = steps.claim  # type: ignore[method-assign]
    executor._supervisor = steps  # type: ignore[assignment]
    return executor


@pytest.mark.parametrize("parallelism", [1, 3])
async def test_a_slot_freed_while_a_claim_runs_is_claimed_for_at_once(parallelism: int) -> None:
    """The first claim leaves a slot idle (only ``parallelism - 1`` rows then); the second,
    nudged by new rows, takes the last slot while a step ends: its end saw idle slots and
    did not nudge, so the loop itself must claim for the freed slot rather than wait."""
    steps = ScriptedSteps(backlog=parallelism - 1)
    steps.hold_claim_number = 2
    executor = _executor(steps, parallelism)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor._claim_loop, tg, 1)
            await wait_until(lambda: len(steps.claims) == 1 and executor.running == parallelism - 1)
            steps.backlog += [100, 101]  # new rows, then their nudge
            executor.nudge()
            await steps.in_claim.wait()
            if parallelism > 1:
                steps.end(1)  # a step ends during the second claim (which asked for 1 slot)
                await wait_until(lambda: 1 not in executor._active)
            steps.release_claim.set()
            if parallelism == 1:
                await wait_until(lambda: executor.running == 1)
                steps.end(100)  # the claim took the only slot; its step ends afterwards
            await wait_until(lambda: 101 in executor._active)
            executor._stopping.set()
            executor.nudge()
            for ti_id in list(executor._active):
                steps.end(ti_id)
    assert steps.backlog == []
