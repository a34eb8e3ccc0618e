"""The kit's process cases: ``sluice triggerer`` engines on PostgreSQL (``fleet.py``), in order,
on one fleet per broker (each case starts from "two live engines, one owns the group").

- ``fleet_split``: three watchers of one key, engines of capacity 2 (which would split
  them): one engine owns all three rows, and every message is stored once per watcher.
- ``ack_after_persistence``: ``asset_event`` is locked, messages are published, the owner's
  persister waits on the lock (``pg_stat_activity``): fanned out, not stored. The broker
  still holds every message; the owner is SIGKILLed, the lock released: the survivor
  takes over and stores each message once.
- ``owner_killed``: kill -9 of the owner while messages flow: the survivor takes the group
  over (seconds to own the rows: the table's takeover figure), 0 lost, 0 duplicated.
- ``zombie_owner``: SIGSTOP the owner past the takeover bound, the survivor takes over,
  SIGCONT: from then on the zombie stores no event (``kit.audit``: no insert of its
  ``application_name``), reopens no consumer nor advances the broker (its log: none of the
  adapter's ``consumer_actions``, a ``triggerer_lease_lost`` record), and the rightful owner
  is not disturbed (its log: none of the adapter's ``disturbed_actions``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text

from tests.conformance.fleet import TAKEOVER_BOUND_S, iter_actions, only, settle
from tests.conformance.world import ABC, expected, record_figures
from tests.e2e.helpers import wait_for

if TYPE_CHECKING:
    from tests.conformance.fleet import Engine, Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

CONSUMER_MARGIN_S = 10.0  # the survivor's consumer joins the group / long-polls the queue
LEASE_LOST_S = 10.0  # a resumed zombie notices it lost its rows within this


def _check(fleet: Fleet, ns: range, request: pytest.FixtureRequest, **figures: float) -> None:
    want = expected(ns, ABC)
    settled = settle(fleet, want)
    stored = only(fleet.stored(), ns)
    record_figures(request, fleet.kit, messages=len(ns), stored=stored, want=want, **figures)
    stored.check(want, fleet.kit)
    assert settled, f"the broker still holds {fleet.unresolved()} message(s)"


def test_fleet_split(fleet: Fleet, request: pytest.FixtureRequest) -> None:
    fleet.ready(2)
    ns = fleet.publish(60)
    _check(fleet, ns, request)
    rows = fleet.owners()
    assert len(set(rows.values())) == 1, f"the watchers of one key split across jobs: {rows}"


def test_ack_after_persistence(fleet: Fleet, request: pytest.FixtureRequest) -> None:
    owner, (survivor, *_) = fleet.ready(2)
    locker = create_engine(fleet.url)
    try:
        with locker.connect() as conn:
            conn.execute(text("LOCK TABLE asset_event IN EXCLUSIVE MODE"))
            ns = fleet.publish(20)
            wait_for(
                lambda: fleet.waiting_on_a_lock(owner),
                timeout=30,
                what=f"{owner.name}'s persister to wait on the locked asset_event",
            )
            held = fleet.unresolved()
            fleet.kill(owner)
            conn.rollback()
    finally:
        locker.dispose()
    assert held == len(ns), f"the broker held {held} of {len(ns)} unstored messages at the kill"
    _check(fleet, ns, request)
    assert fleet.owner() is survivor


def test_owner_killed(fleet: Fleet, request: pytest.FixtureRequest) -> None:
    owner, (survivor, *_) = fleet.ready(2)
    first, flowing = fleet.publish(30), threading.Event()
    feeder_error: list[BaseException] = []

    def feed() -> None:  # production goes on while the owner dies
        try:
            while not flowing.is_set():
                fleet.publish(6)
                flowing.wait(0.05)  # the producer's pace, not a wait for the engine
        except BaseException as exc:  # reported by the test thread
            feeder_error.append(exc)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        wait_for(lambda: fleet.stored().total() > 0, timeout=30, what="some events stored")
        fleet.kill(owner)
        killed_at = time.monotonic()
        took = wait_for(
            lambda: fleet.owner() is survivor and time.monotonic() - killed_at,
            timeout=TAKEOVER_BOUND_S + CONSUMER_MARGIN_S,
            what="the survivor to own the group",
        )
        fleet.publish(30)
    finally:
        flowing.set()
        feeder.join(timeout=30)
    assert not feeder_error, feeder_error
    print(f"\n[{fleet.kit.kind}] owner killed: survivor owns the group after {took:.2f}s")
    _check(fleet, range(first.start, fleet.published), request, takeover_s=took)


def test_zombie_owner(fleet: Fleet, request: pytest.FixtureRequest) -> None:
    zombie, (rightful, *_) = fleet.ready(2)
    start = fleet.published
    fleet.publish(20)
    wait_for(
        lambda: fleet.stored().has(expected(range(start, fleet.published), ABC)),
        timeout=30,
        what="the first messages stored",
    )
    os.kill(zombie.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        took = wait_for(
            lambda: fleet.owner() is rightful and time.monotonic() - stopped_at,
            timeout=TAKEOVER_BOUND_S + CONSUMER_MARGIN_S,
            what="the survivor to own the frozen owner's group",
        )
        fleet.publish(20)
        # the rightful owner drains the stream while the zombie is still frozen: what the
        # zombie held comes back by the broker's own bound (session timeout, heartbeat,
        # visibility timeout, idle claim), not when the zombie wakes up
        drained = settle(fleet, expected(range(start, fleet.published), ABC))
        fenced_from = fleet.last_audit_id()
        zombie_log, rightful_log = zombie.log_size(), rightful.log_size()
    finally:
        os.kill(zombie.proc.pid, signal.SIGCONT)
    print(f"\n[{fleet.kit.kind}] zombie: survivor owns the group {took:.2f}s after SIGSTOP")
    assert drained, f"the broker still held {fleet.unresolved()} message(s) of the frozen owner"
    fleet.publish(40)
    lease_lost = _wait_lease_lost(zombie, zombie_log)
    _check(fleet, range(start, fleet.published), request, takeover_s=took)
    by_zombie = [row for row in fleet.audit(after_id=fenced_from) if row[1] == zombie.name]
    assert not by_zombie, f"the zombie stored events after losing its rows: {by_zombie[:5]}"
    consumer = {"shared_stream.group_started", *getattr(fleet.kit, "consumer_actions", ())}
    rejoined = [a for a in iter_actions(zombie.records(after=zombie_log)) if a in consumer]
    assert not rejoined, f"the zombie reopened its consumer / advanced the broker: {rejoined}"
    disturbed = set(getattr(fleet.kit, "disturbed_actions", ()))
    hit = [a for a in iter_actions(rightful.records(after=rightful_log)) if a in disturbed]
    assert not hit, f"the zombie disturbed the rightful owner's consumer: {hit}"
    assert lease_lost, "the resumed zombie never logged triggerer_lease_lost"


def _wait_lease_lost(zombie: Engine, offset: int) -> bool:
    def lost() -> bool:
        return "triggerer_lease_lost" in set(iter_actions(zombie.records(after=offset)))

    try:
        wait_for(lost, timeout=LEASE_LOST_S, what="the zombie to log triggerer_lease_lost")
    except AssertionError:
        return False
    return True
