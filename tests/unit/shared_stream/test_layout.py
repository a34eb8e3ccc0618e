"""Who may talk to whom inside ``shared_stream``, and the small pieces the group drives.

The group alone drives the ack ledger and carries out its effects; its task (poll, advancer,
timer) reports to it through a port; a subscriber stream reports to its group and knows
nothing of the ledger; binding seqs are routed to their group by ``BindingRoutes``; the
advance slot and the deadline timer only wait.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import anyio
import pytest

import shared_stream
from shared_stream.advancer import AdvanceSlot
from shared_stream.effects import AdvanceBatch
from shared_stream.routes import BindingRoutes
from shared_stream.testing import FakeClock
from shared_stream.timer import DeadlineTimer

PACKAGE = Path(shared_stream.__file__).parent


def package_imports(module: str) -> set[str]:
    """The ``shared_stream`` modules ``module`` imports (type-only imports included)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        imported.update(n.split(".")[1] for n in names if n.startswith("shared_stream."))
    return imported


MODULES = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)]) if m.name != "__init__")


def test_only_the_group_drives_the_ledger():
    assert {m for m in MODULES if "bookkeeping" in package_imports(m)} == {"group"}


def test_only_the_ledger_drives_its_event_lanes():
    assert {m for m in MODULES if "lanes" in package_imports(m)} == {"bookkeeping"}


def test_only_the_group_carries_out_effects():
    users = {m for m in MODULES if "effects" in package_imports(m)}
    # the ledger (bookkeeping and its lanes) makes them; the advancer and the group's task
    # only name the type of the batch they send
    assert users == {"advancer", "bookkeeping", "group", "group_task", "lanes"}, users


def test_the_group_task_knows_its_group_only_through_its_port():
    assert package_imports("group_task").isdisjoint({"group", "bookkeeping", "lanes"})


def test_a_subscriber_stream_knows_nothing_but_itself():
    assert package_imports("subscriber") == set()


def test_settings_are_plain_values():
    assert package_imports("settings") == set()


# -- BindingRoutes ------------------------------------------------------------------------


def test_routes_take_runs_of_one_group_and_skip_unknown_seqs():
    routes: BindingRoutes[str] = BindingRoutes()
    for seq, group in [(1, "a"), (2, "a"), (3, "b"), (4, "a")]:
        routes.add(seq, group)
    assert list(routes.take([1, 2, 99, 3, 4])) == [("a", [1, 2]), ("b", [3]), ("a", [4])]
    assert len(routes) == 0


def test_routes_skip_seqs_voided_while_an_earlier_run_is_handled():
    routes: BindingRoutes[str] = BindingRoutes()
    for seq, group in [(1, "a"), (2, "b"), (3, "a"), (4, "a")]:
        routes.add(seq, group)
    handled = []
    for group, run in routes.take([1, 2, 3, 4]):
        handled.append((group, run))
        if group == "a":
            routes.void([3])  # e.g. refusing seq 1 rejected its raw event, also bound to 3
    assert handled == [("a", [1]), ("b", [2]), ("a", [4])]
    assert "unconfirmed=0" in repr(routes)


def test_routes_hand_out_increasing_seqs():
    routes: BindingRoutes[str] = BindingRoutes()
    assert [next(routes.seqs) for _ in range(3)] == [1, 2, 3]


# -- AdvanceSlot and DeadlineTimer --------------------------------------------------------


async def test_the_slot_holds_one_batch_with_its_dispatch_time():
    clock = FakeClock(10.0)
    slot = AdvanceSlot(clock)
    assert slot.take() is None
    batch = AdvanceBatch(lane=None, items=(), seqs=())
    slot.put(batch)
    clock.advance(5)
    assert slot.take() == (batch, 10.0)
    assert slot.take() is None
    slot.put(batch)
    slot.clear()
    assert slot.take() is None


async def test_the_slot_wakes_its_waiter_on_put_and_on_wake():
    slot = AdvanceSlot(FakeClock())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(slot.wait)
            await anyio.wait_all_tasks_blocked()
            slot.put(AdvanceBatch(lane=None, items=(), seqs=()))
        async with anyio.create_task_group() as tg:
            tg.start_soon(slot.wait)
            await anyio.wait_all_tasks_blocked()
            slot.wake()


@pytest.mark.parametrize("deadline", [-1.0, 0.0])
async def test_the_timer_returns_at_once_past_a_deadline(deadline):
    timer = DeadlineTimer(FakeClock())
    with anyio.fail_after(5):
        assert await timer.wait_until(deadline) is True


async def test_the_timer_without_a_deadline_waits_for_a_poke():
    timer = DeadlineTimer(FakeClock())
    timer.poke()  # not waiting: nothing to wake, nothing remembered
    results: list[bool] = []

    async def wait() -> None:
        results.append(await timer.wait_until(None))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert "idle=True" in repr(timer)
            timer.poke()
    assert results == [False]
