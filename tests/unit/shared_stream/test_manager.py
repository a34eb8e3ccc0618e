"""``SharedStreamManager`` in fast mode and ack mode, driven like the triggerer drives it."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections import Counter
from typing import Any, ClassVar

import anyio
import pytest

import shared_stream
from shared_stream import (
    AckTimeout,
    SharedStreamManager,
    SharedStreamTerminated,
    SubscriberOverflow,
    SubscriptionError,
    reject_shared_stream_event,
)
from shared_stream.subscriber import CATCH_UP_EVERY
from shared_stream.testing import (
    BlockingProducer,
    FakeClock,
    InMemoryFeed,
    InMemoryProducer,
    SubscriberHarness,
)
from tests.waiting import wait_until
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of
from triggers.exceptions import UpstreamRefused, UpstreamUnavailable

POLL_LOG = "Shared stream group started key="


class FastTrigger(BaseEventTrigger):
    """Fast mode: raw events come from a memory stream registered under ``source``."""

    sources: ClassVar[dict[str, Any]] = {}
    opened: ClassVar[Counter[str]] = Counter()
    closed: ClassVar[Counter[str]] = Counter()

    def __init__(self, *, source: str, match: str | None = None) -> None:
        super().__init__()
        self.source = source
        self.match = match
        self.seen: list[Any] = []

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"source": self.source, "match": self.match}

    async def run(self):
        yield TriggerEvent({})

    def shared_stream_key(self):
        return (type(self).__name__, self.source)

    @classmethod
    async def open_shared_stream(cls, kwargs):
        cls.opened[kwargs["source"]] += 1
        try:
            async for item in cls.sources[kwargs["source"]]:
                yield item
        finally:
            cls.closed[kwargs["source"]] += 1

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            self.seen.append(raw)
            if raw.get("reject_here"):
                reject_shared_stream_event()
            if self.match is None or raw.get("name") == self.match:
                yield TriggerEvent(raw)


class AckTrigger(FastTrigger):
    """Ack mode: the factory hands out the producers a test registered for ``source``."""

    producers: ClassVar[dict[str, list[Any]]] = {}  # producers, or an error to raise
    factory_calls: ClassVar[Counter[str]] = Counter()

    def __init__(self, *, source: str, match: str | None = None) -> None:
        super().__init__(source=source, match=match)
        self.rejects = False  # per instance, not part of the group's kwargs
        self.hold_after_reject: anyio.Event | None = None

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        cls.factory_calls[kwargs["source"]] += 1
        producer = cls.producers[kwargs["source"]].pop(0)
        if isinstance(producer, Exception):
            raise producer
        return producer

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            self.seen.append(raw)
            if self.rejects and raw.get("reject"):
                reject_shared_stream_event()
                if self.hold_after_reject is not None:
                    await self.hold_after_reject.wait()
                continue
            if self.match is None or raw.get("name") == self.match:
                yield TriggerEvent(raw)


@pytest.fixture(autouse=True)
def _registries():
    for registry in (FastTrigger.sources, FastTrigger.opened, FastTrigger.closed):
        registry.clear()
    AckTrigger.producers.clear()
    AckTrigger.factory_calls.clear()


def fast_source(name: str) -> InMemoryFeed:
    feed = FastTrigger.sources[name] = InMemoryFeed()
    return feed


def register(source: str, *producers: Any) -> Any:
    AckTrigger.producers.setdefault(source, []).extend(producers)
    return producers[0]


def start(tg, manager, trigger, trigger_id, **kwargs) -> SubscriberHarness:
    harness = SubscriberHarness(manager, trigger, trigger_id=trigger_id, **kwargs)
    tg.start_soon(harness.run)
    return harness


def poll_tasks() -> list[str]:
    return sorted(
        t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("shared-stream-poll")
    )


def outcome_counts(producer: InMemoryProducer) -> list[tuple[Any, tuple[int, int, int]]]:
    return [(p, (o.acked, o.failed, o.rejected)) for p, o in producer.advanced]


# -- the package surface ------------------------------------------------------------------


def test_all_matches_the_names_the_package_loads_on_first_use():
    assert isinstance(shared_stream.__all__, tuple)
    assert set(shared_stream.__all__) == set(shared_stream._MODULE_OF)
    for name in shared_stream.__all__:
        module = importlib.import_module(shared_stream._MODULE_OF[name])
        assert getattr(shared_stream, name) is getattr(module, name), name


# -- fast mode ----------------------------------------------------------------------------


async def test_equal_keys_share_one_poll_task_and_one_log_line(caplog):
    caplog.set_level(logging.INFO, logger="shared_stream")
    with anyio.fail_after(5):
        feed_a, feed_b = fast_source("a"), fast_source("b")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            subs = [
                start(tg, mgr, FastTrigger(source="a", match=m), i) for i, m in enumerate("xyz")
            ]
            other = start(tg, mgr, FastTrigger(source="b"), 9)
            raw = {"name": "y"}
            feed_a.put(raw)
            feed_b.put({"name": "q"})
            await other.wait_for_events(1)
            await subs[1].wait_for_events(1)
            assert subs[1].events == [TriggerEvent(raw)]
            for harness in subs:  # the same object went to every subscriber, unchanged
                await anyio.wait_all_tasks_blocked()
                assert harness.trigger.seen == [raw] and harness.trigger.seen[0] is raw
            assert subs[0].events == subs[2].events == []
            assert poll_tasks() == [
                "shared-stream-poll[('FastTrigger', 'a')]",
                "shared-stream-poll[('FastTrigger', 'b')]",
            ]
            assert FastTrigger.opened == {"a": 1, "b": 1}
            assert mgr.bind_pending_event(trigger_id=0, key=("FastTrigger", "a")) is None
            tg.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(POLL_LOG)]
    assert lines == [
        "Shared stream group started key=('FastTrigger', 'a')",
        "Shared stream group started key=('FastTrigger', 'b')",
    ]


async def test_subscriber_joining_after_a_broadcast_does_not_get_it():
    with anyio.fail_after(5):
        feed = fast_source("s")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            first = start(tg, mgr, FastTrigger(source="s"), 1)
            feed.put({"n": 1})
            await first.wait_for_events(1)
            late = start(tg, mgr, FastTrigger(source="s"), 2)
            feed.put({"n": 2})
            await first.wait_for_events(2)
            await late.wait_for_events(1)
            assert late.payloads == [{"n": 2}]
            tg.cancel_scope.cancel()


async def test_full_queue_fails_only_that_subscriber():
    with anyio.fail_after(5):
        feed = fast_source("s")
        async with (
            SharedStreamManager(max_subscriber_queue=2) as mgr,
            anyio.create_task_group() as tg,
        ):
            slow = start(tg, mgr, FastTrigger(source="s"), 1)
            fast = start(tg, mgr, FastTrigger(source="s"), 2)
            slow.pause()  # stops pulling after its first event: its queue fills
            feed.put({"n": 0})
            await slow.wait_for_events(1)
            for n in range(1, 6):
                feed.put({"n": n})
            await fast.wait_for_events(6)
            slow.resume()
            await slow.wait_finished()
            assert isinstance(slow.error, SubscriberOverflow)
            assert "queue of 2" in str(slow.error)
            assert slow.payloads == [{"n": 0}]
            feed.put({"n": 6})
            await fast.wait_for_events(7)
            assert fast.error is None
            tg.cancel_scope.cancel()


async def test_poll_raising_fails_every_subscriber_with_that_error():
    with anyio.fail_after(5):
        feed = fast_source("s")
        boom = RuntimeError("upstream down")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            subs = [start(tg, mgr, FastTrigger(source="s"), i) for i in (1, 2)]
            feed.put({"n": 1})
            feed.put(boom)
            for harness in subs:
                await harness.wait_finished()
                assert harness.error is boom
                assert harness.payloads == [{"n": 1}]  # queued events still delivered
            assert FastTrigger.closed["s"] == 1
            again = start(tg, mgr, FastTrigger(source="s"), 3)  # a fresh group
            feed.put({"n": 2})
            await again.wait_for_events(1)
            assert FastTrigger.opened["s"] == 2
            tg.cancel_scope.cancel()


async def test_poll_returning_is_an_error_too():
    with anyio.fail_after(5):
        feed = fast_source("s")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            subs = [start(tg, mgr, FastTrigger(source="s"), i) for i in (1, 2)]
            feed.put({"n": 1})
            feed.finish()
            for harness in subs:
                await harness.wait_finished()
                assert isinstance(harness.error, SharedStreamTerminated)
                assert "ended" in str(harness.error)


async def test_last_unsubscribe_stops_the_group_and_a_new_subscribe_starts_a_fresh_one(caplog):
    caplog.set_level(logging.INFO, logger="shared_stream")
    with anyio.fail_after(5):
        feed = fast_source("s")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            subs = [start(tg, mgr, FastTrigger(source="s"), i) for i in (1, 2)]
            feed.put({"n": 1})
            await subs[1].wait_for_events(1)
            await mgr.unsubscribe(1, ("FastTrigger", "s"))
            assert FastTrigger.closed["s"] == 0  # one subscriber left
            await mgr.unsubscribe(2, ("FastTrigger", "s"))
            assert FastTrigger.closed["s"] == 1
            assert poll_tasks() == []
            fresh = start(tg, mgr, FastTrigger(source="s"), 3)
            feed.put({"n": 2})
            await fresh.wait_for_events(1)
            assert FastTrigger.opened["s"] == 2
            tg.cancel_scope.cancel()
    assert sum(r.getMessage().startswith(POLL_LOG) for r in caplog.records) == 2


async def test_cohort_grace_period_lets_siblings_join_before_the_first_poll():
    with anyio.fail_after(5):
        feed = fast_source("s")
        feed.put({"n": 1})
        async with (
            SharedStreamManager(cohort_grace_period=0.2) as mgr,
            anyio.create_task_group() as tg,
        ):
            first = start(tg, mgr, FastTrigger(source="s"), 1)
            await anyio.wait_all_tasks_blocked()
            assert FastTrigger.opened["s"] == 0
            second = start(tg, mgr, FastTrigger(source="s"), 2)
            await first.wait_for_events(1)
            await second.wait_for_events(1)
            tg.cancel_scope.cancel()


async def test_without_grace_period_the_poll_starts_at_once():
    with anyio.fail_after(5):
        fast_source("s")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            start(tg, mgr, FastTrigger(source="s"), 1)
            await anyio.wait_all_tasks_blocked()
            assert FastTrigger.opened["s"] == 1
            tg.cancel_scope.cancel()


async def test_reject_outside_an_ack_window_warns_and_does_nothing(caplog):
    with anyio.fail_after(5):
        reject_shared_stream_event()  # no stream at all
        feed = fast_source("s")
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, FastTrigger(source="s"), 1)
            feed.put({"reject_here": True})
            await harness.wait_for_events(1)  # fast path: the event still fires
            tg.cancel_scope.cancel()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.action for r in warnings] == ["shared_stream.reject_ignored"] * 2
    assert warnings[1].trigger_id == 1


async def test_run_form_serves_until_aclose():
    with anyio.fail_after(5):
        feed = fast_source("s")
        mgr = SharedStreamManager()
        with pytest.raises(SubscriptionError, match="not running"):
            mgr.subscribe(trigger_id=1, trigger=FastTrigger(source="s"), key=("k",))
        async with anyio.create_task_group() as tg:
            await tg.start(mgr.run)
            harness = start(tg, mgr, FastTrigger(source="s"), 1)
            feed.put({"n": 1})
            await harness.wait_for_events(1)
            await mgr.aclose()
            await harness.wait_finished()
            assert isinstance(harness.error, SharedStreamTerminated)
        assert FastTrigger.closed["s"] == 1
        assert "groups=0" in repr(mgr)


async def test_subscribe_rejects_bad_calls():
    with anyio.fail_after(5):
        fast_source("s")
        async with SharedStreamManager() as mgr:
            trigger = FastTrigger(source="s")
            with pytest.raises(SubscriptionError, match="no shared_stream_key"):
                mgr.subscribe(trigger_id=1, trigger=trigger, key=None)
            with pytest.raises(SubscriptionError, match="unhashable"):
                mgr.subscribe(trigger_id=1, trigger=trigger, key=["list"])
            mgr.subscribe(trigger_id=1, trigger=trigger, key=("FastTrigger", "s"))
            with pytest.raises(SubscriptionError, match="already subscribed"):
                mgr.subscribe(trigger_id=1, trigger=trigger, key=("FastTrigger", "s"))
            await mgr.unsubscribe(1, ("FastTrigger", "s"))


async def test_subscription_errors_are_the_builtin_types_airflow_raises():
    """Ported Airflow code catches ValueError (no key) and RuntimeError (subscribed twice)."""
    with anyio.fail_after(5):
        fast_source("s")
        mgr = SharedStreamManager()
        trigger = FastTrigger(source="s")
        key = trigger.shared_stream_key()
        with pytest.raises(RuntimeError, match="not running") as not_running:
            mgr.subscribe(trigger_id=1, trigger=trigger, key=key)
        assert isinstance(not_running.value, SubscriptionError)
        async with mgr:
            with pytest.raises(ValueError, match="no shared_stream_key") as no_key:
                mgr.subscribe(trigger_id=1, trigger=trigger, key=None)
            assert isinstance(no_key.value, SubscriptionError)
            mgr.subscribe(trigger_id=1, trigger=trigger, key=key)
            with pytest.raises(RuntimeError, match="already subscribed") as twice:
                mgr.subscribe(trigger_id=1, trigger=trigger, key=key)
            assert isinstance(twice.value, SubscriptionError)
            assert not isinstance(twice.value, ValueError)
            assert not isinstance(no_key.value, RuntimeError)
            await mgr.unsubscribe(1, key)


async def test_an_async_shared_stream_key_is_refused_clearly():
    with anyio.fail_after(5):

        async def key_coroutine() -> tuple[str, ...]:
            return ("k",)

        async with SharedStreamManager() as mgr:
            with pytest.raises(ValueError, match="async def") as info:
                mgr.subscribe(trigger_id=1, trigger=FastTrigger(source="s"), key=key_coroutine())
            assert isinstance(info.value, SubscriptionError)
            assert mgr.group_keys == ()


async def test_after_stop_all_a_subscribe_starts_a_fresh_group_while_run_serves():
    with anyio.fail_after(5):
        feed = fast_source("s")
        mgr = SharedStreamManager()
        run_ended = anyio.Event()

        async def serve(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            try:
                await mgr.run(task_status=task_status)
            finally:
                run_ended.set()

        async with anyio.create_task_group() as tg:
            await tg.start(serve)
            first = start(tg, mgr, FastTrigger(source="s"), 1)
            feed.put({"n": 1})
            await first.wait_for_events(1)
            await mgr.stop_all()
            await first.wait_finished()
            assert isinstance(first.error, SharedStreamTerminated)
            await anyio.wait_all_tasks_blocked()
            assert not run_ended.is_set()  # stop_all() stops the groups, not the manager
            again = start(tg, mgr, FastTrigger(source="s"), 1)  # the same trigger id too
            other = start(tg, mgr, FastTrigger(source="s"), 2)
            feed.put({"n": 2})
            await again.wait_for_events(1)
            await other.wait_for_events(1)
            assert [e.payload for e in again.events] == [{"n": 2}]
            assert FastTrigger.opened["s"] == 2 and poll_tasks() == [
                "shared-stream-poll[('FastTrigger', 's')]"
            ]
            await mgr.aclose()  # stops the groups and ends run()
            await run_ended.wait()
        assert FastTrigger.closed["s"] == 2
        assert isinstance(again.error, SharedStreamTerminated)
        assert "groups=0" in repr(mgr) and "running=False" in repr(mgr)


async def test_after_stop_all_a_fresh_ack_mode_group_advances():
    with anyio.fail_after(5):
        old = register("s", InMemoryProducer())
        new = register("s", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            first = start(tg, mgr, AckTrigger(source="s"), 1)
            await old.put({"n": 1}, "p1")
            await old.wait_for_advanced(1)
            await mgr.stop_all()
            await first.wait_finished()
            await old.wait_closed()
            second = start(tg, mgr, AckTrigger(source="s"), 1)
            await new.put({"n": 2}, "p2")
            await second.wait_for_events(1)
            await new.wait_for_advanced(1)
            assert AckTrigger.factory_calls == {"s": 2}
            assert outcome_counts(old) == [("p1", (1, 0, 0))]
            assert outcome_counts(new) == [("p2", (1, 0, 0))]
            assert mgr.pending_confirmations == 0
            tg.cancel_scope.cancel()


async def test_once_run_has_exited_subscribe_says_so_and_run_can_start_again():
    with anyio.fail_after(5):
        feed = fast_source("s")
        mgr = SharedStreamManager()
        trigger = FastTrigger(source="s")
        async with anyio.create_task_group() as tg:
            await tg.start(mgr.run)
            await mgr.aclose()
        with pytest.raises(RuntimeError, match="not running") as info:
            mgr.subscribe(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
        assert isinstance(info.value, SubscriptionError)
        async with anyio.create_task_group() as tg:
            await tg.start(mgr.run)
            with pytest.raises(RuntimeError, match="already running"):
                await tg.start(mgr.run)
            harness = start(tg, mgr, trigger, 1)
            feed.put({"n": 1})
            await harness.wait_for_events(1)
            await mgr.aclose()
        assert FastTrigger.opened["s"] == FastTrigger.closed["s"] == 1


# -- ack mode -----------------------------------------------------------------------------


async def test_factory_is_called_once_per_group():
    with anyio.fail_after(5):
        producer = register("a", InMemoryProducer())
        register("b", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            subs = [start(tg, mgr, AckTrigger(source="a"), i) for i in range(3)]
            start(tg, mgr, AckTrigger(source="b"), 9)
            await producer.put({"n": 1}, "p1")
            for harness in subs:
                await harness.wait_for_events(1)
            await producer.wait_for_advanced(1)
            assert AckTrigger.factory_calls == {"a": 1, "b": 1}
            assert outcome_counts(producer) == [("p1", (3, 0, 0))]
            assert all(seq is not None for h in subs for seq in h.seqs)
            tg.cancel_scope.cancel()


async def test_advance_waits_for_confirm_persisted():
    with anyio.fail_after(5):
        producer = register("s", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1, auto_confirm=False)
            await producer.put({"n": 1}, "p1")
            await harness.wait_for_events(1)
            await anyio.wait_all_tasks_blocked()  # moved past it, not persisted yet
            assert producer.attempted_batches == []
            harness.confirm_all()
            await producer.wait_for_advanced(1)
            assert outcome_counts(producer) == [("p1", (1, 0, 0))]
            tg.cancel_scope.cancel()


class GatedTrigger(AckTrigger):
    """Waits at the raw events named in ``gates`` (by ``n``) inside its binding window."""

    def __init__(self, *, source: str, match: str | None = None) -> None:
        super().__init__(source=source, match=match)
        self.gates: dict[int, anyio.Event] = {}

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            gate = self.gates.get(raw["n"])
            if gate is not None:
                await gate.wait()
            yield TriggerEvent(raw)


async def test_a_subscriber_that_never_runs_dry_still_gets_its_events_advanced():
    """The stream moves its cursor without telling the ledger, and reports when it waits;
    one that always has a next event queued reports every CATCH_UP_EVERY events instead."""
    every = CATCH_UP_EVERY
    total = 2 * every + 5
    with anyio.fail_after(10):
        producer = register("s", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            trigger = GatedTrigger(source="s")
            first, held = anyio.Event(), anyio.Event()
            trigger.gates = {0: first, every + 2: held}
            start(tg, mgr, trigger, 1)
            for n in range(total):
                await producer.put({"n": n}, f"p{n}")
            await wait_until(lambda: mgr.stats()[0].queue_depth == total - 1)
            first.set()  # it takes them one after the other, never finding its queue empty
            await producer.wait_for_advanced(every)
            await anyio.wait_all_tasks_blocked()
            assert mgr.stats()[0].queue_depth > 0  # it never waited
            assert producer.advanced_payloads == [f"p{n}" for n in range(every)]
            held.set()
            await producer.wait_for_advanced(total)
            assert producer.advanced_payloads == [f"p{n}" for n in range(total)]
            tg.cancel_scope.cancel()


async def test_lanes_are_independent_and_strictly_ordered_within():
    with anyio.fail_after(5):
        producer = register("s", InMemoryProducer(lane=lambda payload: payload[0]))
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1, auto_confirm=False)
            await producer.put({"n": 0}, ("slow", 0))
            await harness.wait_for_events(1)
            slow_seq = harness.unconfirmed.pop()
            for n in range(1, 4):
                await producer.put({"n": n}, ("fast", n))
            await harness.wait_for_events(4)
            harness.confirm_all()
            await producer.wait_for_advanced(3)  # the slow lane does not hold them back
            assert producer.advanced_payloads == [("fast", 1), ("fast", 2), ("fast", 3)]
            mgr.confirm_persisted([slow_seq])
            await producer.wait_for_advanced(4)
            assert producer.advanced_payloads[-1] == ("slow", 0)
            tg.cancel_scope.cancel()


async def test_at_most_one_advance_in_flight_and_resolved_events_accumulate():
    with anyio.fail_after(5):
        producer = register("s", BlockingProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1)
            await producer.put({"n": 1}, "p1")
            await producer.wait_blocked()
            for n in (2, 3):
                await producer.put({"n": n}, f"p{n}")
            await harness.wait_for_events(3)
            await anyio.wait_all_tasks_blocked()
            assert len(producer.attempted_batches) == 1
            producer.release_all()
            await producer.wait_for_advanced(3)
            assert [[p for p, _ in b] for b in producer.batches] == [["p1"], ["p2", "p3"]]
            assert producer.max_concurrent_advances == 1
            tg.cancel_scope.cancel()


async def test_advance_raising_terminates_the_group():
    with anyio.fail_after(5):
        boom = RuntimeError("commit refused")
        producer = register("s", InMemoryProducer(fail_advance=boom), InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            subs = [start(tg, mgr, AckTrigger(source="s"), i) for i in (1, 2)]
            await producer.put({"n": 1}, "p1")
            for harness in subs:
                await harness.wait_finished()
                assert harness.error is boom
            await producer.wait_closed()
            await producer.put({"n": 2}, "p2")
            await anyio.wait_all_tasks_blocked()
            assert len(producer.attempted_batches) == 1
            assert producer.batches == []
            assert producer.aclose_count == 1
            start(tg, mgr, AckTrigger(source="s"), 3)  # a new group, a new producer
            await anyio.wait_all_tasks_blocked()
            assert AckTrigger.factory_calls["s"] == 2
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("failure", ["open_stream", "factory", "lane", "returns"])
async def test_producer_failures_terminate_the_group(failure):
    with anyio.fail_after(5):
        boom = ValueError(failure)
        lane = None
        if failure == "lane":

            def lane(payload):
                raise boom

        producer = InMemoryProducer(fail_open=boom if failure == "open_stream" else None, lane=lane)
        register("s", boom if failure == "factory" else producer)
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1)
            if failure == "lane":
                await producer.put({"n": 1}, "p1")
            if failure == "returns":
                producer.finish()
            await harness.wait_finished()
            if failure == "returns":
                assert isinstance(harness.error, SharedStreamTerminated)
            else:
                assert harness.error is boom
            if failure != "factory":
                await producer.wait_closed()
                assert producer.aclose_count == 1
                assert producer.attempted_batches == []


def _group_lines(caplog) -> list[tuple[str, str]]:
    actions = ("shared_stream.group_started", "shared_stream.group_terminated")
    return [
        (r.levelname, r.__dict__["action"].rsplit("_", 1)[1])
        for r in caplog.records
        if r.__dict__.get("action") in actions
    ]


@pytest.mark.parametrize(
    ("error", "levels"),
    [
        # unreachable: the subscribers' runtime warns once; the group's retries stay quiet
        (UpstreamUnavailable("down", address="b:1"), ["INFO", "DEBUG", "DEBUG", "DEBUG"]),
        (ConnectionRefusedError(111, "refused"), ["INFO", "DEBUG", "DEBUG", "DEBUG"]),
        # refused (a login, a TLS handshake): the runtime reports it, once per distinct error
        (UpstreamRefused("bad password", address="b:1"), ["INFO", "DEBUG", "DEBUG", "DEBUG"]),
        # anything else is an error each time, and the next group is started loudly
        (ValueError("bug"), ["INFO", "ERROR", "INFO", "ERROR"]),
    ],
)
async def test_a_group_that_cannot_reach_its_upstream_retries_quietly(caplog, error, levels):
    caplog.set_level(logging.DEBUG, logger="shared_stream")
    with anyio.fail_after(5):
        register("s", InMemoryProducer(fail_open=error), InMemoryProducer(fail_open=error))
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            for attempt in (1, 2):
                harness = start(tg, mgr, AckTrigger(source="s"), attempt)
                await harness.wait_finished()
                assert harness.error is error
                await wait_until(lambda: not mgr._live)  # the group's task ends too
    assert [level for level, _ in _group_lines(caplog)] == levels
    assert [what for _, what in _group_lines(caplog)] == ["started", "terminated"] * 2


async def test_a_group_started_again_says_how_its_previous_group_ended(caplog):
    """One line per real start: a key's second group says it is a restart, and why."""
    caplog.set_level(logging.INFO, logger="shared_stream")
    clock = FakeClock(100.0)
    with anyio.fail_after(5):
        register("s", InMemoryProducer(), InMemoryProducer())
        async with SharedStreamManager(clock=clock) as mgr, anyio.create_task_group() as tg:
            for trigger_id in (1, 2):
                harness = start(tg, mgr, AckTrigger(source="s"), trigger_id)
                await mgr.unsubscribe(trigger_id, ("AckTrigger", "s"))  # the last one leaves
                await harness.wait_finished()
                await wait_until(lambda: not mgr._live)
                clock.advance(2.5)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(POLL_LOG)]
    assert lines == [
        "Shared stream group started key=('AckTrigger', 's')",
        "Shared stream group started key=('AckTrigger', 's') (again, 2.5s after its previous "
        "group stopped: its last subscriber left)",
    ]


class SlowToCloseProducer(InMemoryProducer):
    """Its ``aclose`` waits for ``closable``: the group stays draining meanwhile."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.closable = anyio.Event()

    async def aclose(self) -> None:
        await self.closable.wait()
        await super().aclose()


async def test_a_retry_while_the_unreachable_group_still_closes_stays_quiet(caplog):
    """The trigger runtime may come back before the failed group's producer has closed:
    that start is the same quiet retry."""
    caplog.set_level(logging.DEBUG, logger="shared_stream")
    down = UpstreamUnavailable("down", address="b:1")
    slow = SlowToCloseProducer()
    with anyio.fail_after(5):
        register("s", slow, InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            first = start(tg, mgr, AckTrigger(source="s"), 1)
            await slow.wait_opened()
            mgr._groups[("AckTrigger", "s")].terminate(down)
            await first.wait_finished()
            assert mgr._live  # its producer has not closed yet
            start(tg, mgr, AckTrigger(source="s"), 1)
            slow.closable.set()
            await wait_until(lambda: len(mgr._live) == 1)
            tg.cancel_scope.cancel()
    started = [
        r for r in caplog.records if r.__dict__.get("action") == "shared_stream.group_started"
    ]
    assert [
        (r.levelname, r.getMessage().endswith("(retrying its unreachable upstream)"))
        for r in started
    ] == [
        ("INFO", False),
        ("DEBUG", True),
    ]


async def test_reject_inside_the_window_resolves_at_once():
    with anyio.fail_after(5):
        producer = register("s", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            rejecting = AckTrigger(source="s")
            rejecting.rejects = True
            rejecting.hold_after_reject = anyio.Event()
            harness = start(tg, mgr, rejecting, 1)
            other = start(tg, mgr, AckTrigger(source="s"), 2)
            await producer.put({"reject": True}, "bad")
            await other.wait_for_events(1)
            await producer.wait_for_advanced(1)  # the rejecting filter has not pulled again
            assert outcome_counts(producer) == [("bad", (1, 0, 1))]
            assert not producer.advanced[0].outcome.is_clean
            assert harness.events == []
            rejecting.hold_after_reject.set()
            await producer.put({"n": 2}, "good")
            await producer.wait_for_advanced(2)
            assert outcome_counts(producer)[1] == ("good", (2, 0, 0))
            tg.cancel_scope.cancel()


async def test_ack_timeout_fails_the_stalled_subscriber_at_the_exact_boundary():
    with anyio.fail_after(5):
        clock = FakeClock(100.0)
        producer = register("s", InMemoryProducer())
        async with (
            SharedStreamManager(ack_timeout=10.0, clock=clock) as mgr,
            anyio.create_task_group() as tg,
        ):
            stalled = start(tg, mgr, AckTrigger(source="s"), 1, auto_confirm=False)
            healthy = start(tg, mgr, AckTrigger(source="s"), 2)
            await producer.put({"n": 1}, "p1")
            await stalled.wait_for_events(1)
            await healthy.wait_for_events(1)
            await anyio.wait_all_tasks_blocked()
            clock.advance(9.5)
            await mgr.check_timeouts()
            assert stalled.error is None and producer.attempted_batches == []
            clock.advance(0.5)  # now - broadcast_time == ack_timeout exactly
            await mgr.check_timeouts()
            await stalled.wait_finished()
            assert isinstance(stalled.error, AckTimeout)
            await producer.wait_for_advanced(1)
            assert outcome_counts(producer) == [("p1", (1, 1, 0))]
            back = start(tg, mgr, AckTrigger(source="s"), 1)  # its trigger's restart
            await producer.put({"n": 2}, "p2")
            await producer.wait_for_advanced(2)
            assert healthy.error is None
            assert back.payloads == healthy.payloads[1:] == [{"n": 2}]
            tg.cancel_scope.cancel()


async def test_zero_subscriber_broadcast_is_advanced_and_not_clean():
    with anyio.fail_after(5):
        producer = register("s", InMemoryProducer())
        # the overflowed subscriber is never back: the group waits for it 0.05 s only
        async with SharedStreamManager(max_subscriber_queue=1, cohort_return=0.05) as mgr:
            trigger = AckTrigger(source="s")
            mgr.subscribe(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
            for n in range(3):  # never pulled: the second event overflows the queue
                await producer.put({"n": n}, f"p{n}")
            await producer.wait_for_advanced(3)
            assert outcome_counts(producer) == [
                ("p0", (0, 1, 0)),
                ("p1", (0, 1, 0)),
                ("p2", (0, 0, 0)),
            ]
            assert not any(o.is_clean for _, o in producer.advanced)
            await mgr.unsubscribe(1, trigger.shared_stream_key())  # the group stops
            assert producer.aclose_count == 1


async def test_stop_all_drains_resolved_events_and_abandons_the_rest():
    with anyio.fail_after(5):
        producer = register("s", BlockingProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1)
            await producer.put({"n": 1}, "p1")
            await producer.wait_blocked()
            await producer.put({"n": 2}, "p2")
            await harness.wait_for_events(2)
            harness.pause()  # stays on p3: never resolved
            await producer.put({"n": 3}, "p3")
            await harness.wait_for_events(3)
            stopped = anyio.Event()

            async def stop() -> None:
                await mgr.stop_all()
                stopped.set()

            tg.start_soon(stop)
            await anyio.wait_all_tasks_blocked()
            assert not stopped.is_set() and producer.aclose_count == 0
            producer.release_all()
            await stopped.wait()
            assert [[p for p, _ in b] for b in producer.batches] == [["p1"], ["p2"]]
            assert producer.aclose_count == 1
            harness.resume()
            await harness.wait_finished()
            assert isinstance(harness.error, SharedStreamTerminated)
