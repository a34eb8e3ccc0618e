"""The executor's admission of scheduled task instances (pools, ``max_active_tasks``) and
its warnings about tasks no pool admits: pure functions of what the claim read."""

from __future__ import annotations

import logging

import pytest

from engine.db.queries.pools import Candidate, PoolRoom
from engine.executor.admission import (
    WARN_EVERY_S,
    PoolWarnings,
    admit,
    is_full,
    occupied_slots,
)


def _candidate(ti_id: int, *, pool: str = "p", slots: int = 1, run: int = 1, cap: int = 16):
    return Candidate(ti_id, run, "d", f"t{ti_id}", pool, slots, cap)


def test_deferred_tasks_take_slots_only_in_pools_that_count_them() -> None:
    pools = {"p": PoolRoom(5, include_deferred=False), "q": PoolRoom(5, include_deferred=True)}
    taken = {("p", "running"): 1, ("p", "deferred"): 2, ("q", "queued"): 1, ("q", "deferred"): 2}
    assert occupied_slots(pools, taken) == {"p": 1, "q": 3}


@pytest.mark.parametrize(
    ("slots", "occupied", "full"), [(2, 1, False), (2, 2, True), (0, 0, True), (-1, 10**6, False)]
)
def test_a_pool_is_full_at_its_slots_unless_unlimited(
    slots: int, occupied: int, full: bool
) -> None:
    assert is_full(PoolRoom(slots, include_deferred=False), occupied) is full


def test_admission_counts_the_slots_of_those_admitted_before() -> None:
    pools = {"p": PoolRoom(3, include_deferred=False)}
    found = [_candidate(1, slots=2), _candidate(2, slots=2), _candidate(3, slots=1)]
    admitted = admit(found, pools, {"p": 0}, {}, limit=10)
    assert [c.ti_id for c in admitted] == [1, 3]  # 2 would need 4 of 3 slots


def test_admission_caps_each_run_at_its_max_active_tasks() -> None:
    pools = {"p": PoolRoom(-1, include_deferred=False)}
    found = [_candidate(i, run=1 if i < 4 else 2, cap=2) for i in range(1, 6)]
    admitted = admit(found, pools, {}, {1: (1, 2)}, limit=10)
    assert [c.ti_id for c in admitted] == [1, 4, 5]  # run 1 had one active already


def test_admission_stops_at_the_limit_and_leaves_its_inputs_alone() -> None:
    pools = {"p": PoolRoom(-1, include_deferred=False)}
    occupied, active = {"p": 0}, {1: (0, 16)}
    admitted = admit([_candidate(i) for i in range(5)], pools, occupied, active, limit=2)
    assert len(admitted) == 2
    assert (occupied, active) == ({"p": 0}, {1: (0, 16)})


def test_each_unstartable_task_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="engine.executor.admission")
    warnings = PoolWarnings()
    missing, small = _candidate(1, pool="nope"), _candidate(2, pool="tiny", slots=3)
    assert warnings.is_due(0.0)
    warnings.warn([(missing, None), (small, 1), (missing, None)])
    assert not warnings.is_due(WARN_EVERY_S / 2)  # looked moments ago
    assert warnings.is_due(WARN_EVERY_S)
    warnings.warn([(missing, None), (small, 1)])
    assert [r.action for r in caplog.records] == ["pool_missing", "pool_too_small"]
    assert PoolWarnings().is_due(0.0)  # another executor's warnings are its own
