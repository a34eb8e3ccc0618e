"""The kit's in-process cases: one real triggerer on SQLite per case, the real broker.

- ``fan_out``: three sibling watchers (kind a, kind b, every message) on one stream of two
  lanes where the broker has them: each stores exactly its messages, once, under the
  broker's dedup keys, through one consumer (one shared-stream group); the broker is never
  advanced past a message before its asset events are stored (checked at every poll).
- ``poison``: a payload that is not JSON among good ones: the good ones fire, the poison
  one is dead-lettered, the messages after it still flow.
- ``dead_letter``: a watcher that rejects two messages (no partition key where it asks for
  one): exactly those reach the dead-letter place; its sibling stores every message.
- ``redelivery_dedup``: the same rejection with no dead-letter place: the broker delivers
  the message again, the catch-all sibling fires it again, and the persister absorbs it:
  one asset event per message.
- ``lane_order``: the database is locked (every subscriber stalls on its events) past the
  triggerer's ``ack_timeout_s``: the subscribers fail, their events go the unclean way, the
  broker is advanced lane by lane; every message ends stored or dead-lettered, none lost,
  and never advanced before it was stored or dead-lettered.
- ``broker_restart``: a private broker stopped and started: each watcher logs one warning
  (the streak's first unavailable failure), then recovers; every message stored once.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from tests.conformance.inprocess import kit_engine
from tests.conformance.world import ABC, expected, message, n_of_raw, record_figures
from tests.waiting import eventually

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conformance.broker import KitBroker, KitStream
    from tests.conformance.inprocess import KitEngine
    from tests.conformance.world import Stored

pytestmark = pytest.mark.integration

CASE_S = 60.0  # every case's bound; each takes a few seconds
SETTLE_S = 30.0
FAN_OUT_N = 60
LANE_ORDER_ACK_TIMEOUT_S = 1.0
OUTAGE_S = 5.0  # the broker is down at least this long, unless every watcher said so
# broker_restart's watchers retry every 2 s at most, not the engine's 60 s: the recovery waits
# for the next retry after the broker is back (with 1, 2, 4, 8, 16 s, a broker slow to start,
# RabbitMQ's start_app under load, pushed it past the case's bound)
RESTART_BACKOFF_S = (0.5, 2.0)


async def publish(stream: KitStream, ns: range, **extra: Any) -> None:
    """The kit's messages ``ns``, message n on lane ``n % lanes``."""
    for lane in range(stream.lanes):
        await stream.publish(
            [message(n, **extra) for n in ns if n % stream.lanes == lane], lane=lane
        )


def fully_handled(stored: Stored, ns: range, dead: set[int], watched: dict[str, set[int]]) -> int:
    """How many of ``ns`` every watcher that wants them stored, or that were dead-lettered."""
    have = {label: set(got) for label, got in stored.ns.items()}
    return sum(
        1
        for n in ns
        if n in dead
        or all(n in have.get(label, ()) for label, want in watched.items() if n in want)
    )


class Gate:
    """Persistence gating seen from outside: at every observation (the broker read first),
    the messages the broker no longer holds are at most those fully stored or dead-lettered."""

    def __init__(self, stream: KitStream, engine: KitEngine, want: dict[str, set[int]]) -> None:
        self.stream, self.engine, self.want = stream, engine, want
        self.published = 0
        self.violations: list[str] = []

    async def drained(self, ns: range, *, dead_ok: bool = False) -> bool:
        unresolved = await self.stream.unresolved()
        stored = await anyio.to_thread.run_sync(self.engine.stored)
        dead = {n for p in await self.stream.dead_lettered() if (n := n_of_raw(p)) is not None}
        handled = fully_handled(stored, ns, dead if dead_ok else set(), self.want)
        advanced = self.published - unresolved
        if advanced > handled:
            self.violations.append(f"advanced {advanced} > stored or dead-lettered {handled}")
        return unresolved == 0 and handled == len(ns)


async def test_fan_out(
    kit: KitBroker, tmp_path: Path, sqlite_template: Path, request: pytest.FixtureRequest
) -> None:
    with anyio.fail_after(CASE_S):
        async with kit.stream(lanes=2) as stream:
            watchers = {
                label: stream.watcher_source(match=k and {"kind": k}) for label, k in ABC.items()
            }
            ns = range(FAN_OUT_N)
            want = expected(ns, ABC)
            async with kit_engine(
                kit, tmp_path, sqlite_template, stream.imports, watchers
            ) as engine:
                gate = Gate(stream, engine, want)
                await publish(stream, ns)
                gate.published = len(ns)
                await eventually(lambda: gate.drained(ns), within=SETTLE_S, step=0.1)
                stored, groups = engine.stored(), engine.groups()
    record_figures(request, kit, messages=len(ns), stored=stored, want=want)
    stored.check(want, kit)
    assert not gate.violations, gate.violations[:5]
    assert groups == 1, f"the three siblings of one stream ran {groups} consumers"


async def test_poison(
    kit: KitBroker, tmp_path: Path, sqlite_template: Path, request: pytest.FixtureRequest
) -> None:
    poison = b"{kit poison: not json"
    labels = {"a": "a", "b": "b"}
    with anyio.fail_after(CASE_S):
        async with kit.stream() as stream:
            watchers = {
                label: stream.watcher_source(match={"kind": k}) for label, k in labels.items()
            }
            want = expected(range(30), labels)
            async with kit_engine(
                kit, tmp_path, sqlite_template, stream.imports, watchers
            ) as engine:
                await stream.publish([message(n) for n in range(15)])
                await stream.publish_raw(poison)
                await stream.publish([message(n) for n in range(15, 30)])

                async def settled() -> bool:
                    return (
                        engine.stored().has(want)
                        and await stream.unresolved() == 0
                        and poison in await stream.dead_lettered()
                    )

                await eventually(settled, within=SETTLE_S, step=0.1)
                stored, dead = engine.stored(), await stream.dead_lettered()
    record_figures(request, kit, messages=31, stored=stored, want=want)
    stored.check(want, kit)
    assert dead == [poison], f"the dead-letter place holds {dead}, not the poison payload alone"


def keyed_messages(ns: range, without_key: set[int]) -> list[dict[str, Any]]:
    return [message(n) if n in without_key else message(n, pk=f"p{n % 3}") for n in ns]


async def test_dead_letter(
    kit: KitBroker, tmp_path: Path, sqlite_template: Path, request: pytest.FixtureRequest
) -> None:
    ns, rejected = range(20), {4, 11}
    with anyio.fail_after(CASE_S):
        async with kit.stream() as stream:
            watchers = {
                "keyed": stream.watcher_source(options={"partition_key_field": "pk"}),
                "all": stream.watcher_source(),
            }
            want = {"keyed": set(ns) - rejected, "all": set(ns)}
            async with kit_engine(
                kit, tmp_path, sqlite_template, stream.imports, watchers
            ) as engine:
                await stream.publish(keyed_messages(ns, rejected))

                async def settled() -> bool:
                    dead = {n_of_raw(p) for p in await stream.dead_lettered()}
                    return (
                        engine.stored().has(want)
                        and await stream.unresolved() == 0
                        and dead >= rejected
                    )

                await eventually(settled, within=SETTLE_S, step=0.1)
                stored, dead_payloads = engine.stored(), await stream.dead_lettered()
    record_figures(request, kit, messages=len(ns), stored=stored, want=want)
    stored.check(want, kit)
    assert sorted(n_of_raw(p) or -1 for p in dead_payloads) == sorted(rejected), dead_payloads


async def test_redelivery_dedup(
    kit: KitBroker, tmp_path: Path, sqlite_template: Path, request: pytest.FixtureRequest
) -> None:
    ns, rejected = range(12), {5}
    with anyio.fail_after(CASE_S):
        async with kit.stream() as stream:
            watchers = {
                "keyed": stream.watcher_source(
                    dead_letter=False, options={"partition_key_field": "pk"}
                ),
                "all": stream.watcher_source(dead_letter=False),
            }
            want = {"keyed": set(ns) - rejected, "all": set(ns)}
            async with kit_engine(
                kit, tmp_path, sqlite_template, stream.imports, watchers
            ) as engine:
                await stream.publish(keyed_messages(ns, rejected))

                def redelivered() -> bool:
                    return engine.stored().has(want) and engine.absorbed > 0

                await eventually(_sync(redelivered), within=SETTLE_S, step=0.1)
                stored, absorbed = engine.stored(), engine.absorbed
    record_figures(request, kit, messages=len(ns), stored=stored, want=want)
    stored.check(want, kit)
    assert absorbed > 0


def _sync(check: Any) -> Any:
    async def wrapped() -> Any:
        return check()

    return wrapped


async def test_lane_order(
    kit: KitBroker, tmp_path: Path, sqlite_template: Path, request: pytest.FixtureRequest
) -> None:
    first, second = range(10), range(10, 40)
    ns = range(40)
    with anyio.fail_after(CASE_S):
        async with kit.stream(lanes=2) as stream:
            watchers = {
                label: stream.watcher_source(match=k and {"kind": k}) for label, k in ABC.items()
            }
            want = expected(ns, ABC)
            async with kit_engine(
                kit,
                tmp_path,
                sqlite_template,
                stream.imports,
                watchers,
                ack_timeout_s=LANE_ORDER_ACK_TIMEOUT_S,
            ) as engine:
                gate = Gate(stream, engine, want)
                await publish(stream, first)
                gate.published = len(first)
                await eventually(lambda: gate.drained(first), within=SETTLE_S, step=0.1)
                lock = sqlite3.connect(tmp_path / "sluice.db", isolation_level=None, timeout=10)
                try:
                    lock.execute("BEGIN IMMEDIATE")  # the persister cannot write: all stall
                    await publish(stream, second)
                    gate.published = len(ns)
                    # the subscribers fail on their ack timeout (trigger_failed records)
                    await eventually(
                        _sync(lambda: engine.failures(unavailable=False)),
                        within=SETTLE_S,
                        step=0.05,
                    )
                finally:
                    lock.execute("ROLLBACK")
                    lock.close()
                await eventually(lambda: gate.drained(ns, dead_ok=True), within=SETTLE_S, step=0.1)
                reasons = [r.getMessage() for r in engine.failures(unavailable=False)]
                stored, dead = engine.stored(), await stream.dead_lettered()
    dead_ns = {n_of_raw(p) for p in dead}
    kept = {label: set(got) | dead_ns for label, got in stored.ns.items()}
    # A message that went the unclean way is dead-lettered, not lost: the figures say so.
    settled = {label: w - dead_ns for label, w in want.items()}
    record_figures(request, kit, messages=len(ns), stored=stored, want=settled)
    lost = {
        label: sorted(w - kept.get(label, set()))
        for label, w in want.items()
        if w - kept.get(label, set())
    }
    assert not lost, f"neither stored nor dead-lettered: {lost}"
    assert not stored.duplicated(), stored.ns
    assert not gate.violations, gate.violations[:5]
    assert any("AckTimeout" in reason for reason in reasons), reasons


async def test_broker_restart(
    kit: KitBroker, tmp_path: Path, sqlite_template: Path, request: pytest.FixtureRequest
) -> None:
    before, after = range(10), range(10, 20)
    ns = range(20)
    with anyio.fail_after(CASE_S * 1.5):
        async with kit.private() as private, private.stream() as stream:
            watchers = {
                label: stream.watcher_source(match=k and {"kind": k}) for label, k in ABC.items()
            }
            want = expected(ns, ABC)
            async with kit_engine(
                kit,
                tmp_path,
                sqlite_template,
                stream.imports,
                watchers,
                restart_backoff_s=RESTART_BACKOFF_S,
            ) as engine:
                await stream.publish([message(n) for n in before])
                await eventually(
                    _sync(lambda: engine.stored().has(expected(before, ABC))), within=SETTLE_S
                )
                await private.stop()
                # every watcher should say so; past OUTAGE_S the case goes on and fails at
                # the end, after checking the recovery too
                with anyio.move_on_after(OUTAGE_S):
                    await eventually(
                        _sync(lambda: len(_warned(engine)) == len(watchers)), within=OUTAGE_S
                    )
                await private.start()
                await stream.publish([message(n) for n in after])

                async def settled() -> bool:
                    return engine.stored().has(want) and await stream.unresolved() == 0

                await eventually(settled, within=SETTLE_S, step=0.1)
                stored = engine.stored()
                warnings = sorted(_warned(engine, unique=False))
                errors = [r.getMessage()[:300] for r in engine.failures(unavailable=False)]
    record_figures(request, kit, messages=len(ns), stored=stored, want=want)
    stored.check(want, kit)
    assert not errors, errors
    assert sorted(warnings) == sorted(set(warnings)), f"a watcher warned twice: {warnings}"
    assert len(warnings) == len(watchers), (
        f"{len(watchers)} watchers lost their broker for {OUTAGE_S}s, {len(warnings)} said so"
    )


def _warned(engine: KitEngine, *, unique: bool = True) -> Any:
    """The trigger ids of the watchers that said their broker is unavailable."""
    ids = [getattr(r, "trigger_id", -1) for r in engine.failures(unavailable=True)]
    return set(ids) if unique else ids
