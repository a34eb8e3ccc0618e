"""The triggerer's lease, on a fake clock: held for threshold - margin after the start of
the last heartbeat that got through; lost when it lapses or when the database says so, and
then ``watch`` fences first and raises."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from engine.exceptions import LeaseLost
from engine.triggerer.lease import Lease, lease_margin_s
from shared_stream.testing import FakeClock


def test_the_margin_is_a_tenth_of_the_threshold_at_most_one_second() -> None:
    assert lease_margin_s(10.5) == 1.0
    assert lease_margin_s(2.0) == pytest.approx(0.2)


def test_held_until_the_bound_after_the_last_heartbeat_sent() -> None:
    clock = FakeClock(100.0)
    lease = Lease(threshold_s=2.0, clock=clock)  # bound 1.8 s
    assert lease.holds()
    clock.advance(1.7)
    lease.renewed(sent_at=101.0)  # a beat sent at 101.0 got through
    clock.advance(1.0)  # 102.7 <= 101.0 + 1.8
    assert lease.holds()
    clock.advance(0.2)  # 102.9 > 102.8: advances wait, the lease is not lost yet
    assert not lease.holds()
    assert lease.lost is None
    lease.renewed(sent_at=100.5)  # an older beat never moves it back
    assert not lease.holds()
    lease.renewed(sent_at=102.85)  # a slow beat that got through: held again
    assert lease.holds()


def test_a_lost_lease_stays_lost() -> None:
    clock = FakeClock()
    lease = Lease(threshold_s=2.0, clock=clock)
    lease.lose("job 3 is no longer running")
    lease.renewed(sent_at=clock())
    assert not lease.holds()
    assert lease.lost == "job 3 is no longer running"


async def test_watch_fences_then_raises_once_the_lease_lapses() -> None:
    clock = FakeClock()
    lease = Lease(threshold_s=0.5, clock=clock)
    fenced: list[str] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                with pytest.raises(LeaseLost, match="no heartbeat got through"):
                    await lease.watch(fenced.append)

            tg.start_soon(watch)
            await anyio.sleep(3 * lease.tick_s)
            assert fenced == []  # the fake clock has not moved: still held
            clock.advance(0.48)  # past the bound (0.45 s): not held, not lost
            await anyio.sleep(3 * lease.tick_s)
            assert (fenced, lease.holds()) == ([], False)
            clock.advance(0.1)  # past the threshold: another may own the rows now
    assert len(fenced) == 1
    assert "no heartbeat got through for 0.6s" in fenced[0]


async def test_watch_fences_at_once_when_the_database_says_the_lease_is_gone() -> None:
    lease = Lease(threshold_s=600.0)
    fenced: list[str] = []
    with anyio.fail_after(5), pytest.raises(ExceptionGroup) as raised:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lease.watch, fenced.append)
            await anyio.lowlevel.checkpoint()
            lease.lose("job 9 is no longer running")
    assert raised.group_contains(LeaseLost)
    assert fenced == ["job 9 is no longer running"]
