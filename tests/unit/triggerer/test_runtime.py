from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import pytest

from engine.triggerer.outbox import FiredEvent, Outbox, OutboxItem, TriggerFailed
from engine.triggerer.runtime import (
    EXITED_WITHOUT_EVENT,
    RETURNED_EVENT,
    WATCHER_EXITED,
    TriggerKind,
    TriggerRunner,
    TriggerSpec,
)
from shared_stream import SharedStreamManager
from shared_stream.testing import InMemoryProducer
from tests.waiting import wait_until as shared_wait_until
from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import UpstreamUnavailable
from triggers.serde import payload_digest
from triggers.testing import ReplayTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Hashable

TASK = TriggerKind.TASK
WATCHER = TriggerKind.WATCHER


class Probe:
    """What the test triggers of one name did (shared by the fresh instances of a restart)."""

    def __init__(self) -> None:
        self.instances: list[BaseTrigger] = []
        self.runs = 0
        self.cleanups = 0
        self.kills = 0
        self.cleaned = anyio.Event()
        self.started = anyio.Event()


class ScriptTrigger(BaseEventTrigger):
    """Behaves as ``script`` says; ``cleanup`` as ``on_cleanup`` says."""

    probes: ClassVar[dict[str, Probe]] = {}

    def __init__(
        self, name: str, script: str, payloads: tuple[Any, ...] = (1,), on_cleanup: str = "ok"
    ) -> None:
        super().__init__()
        self.name, self.script, self.payloads, self.on_cleanup = name, script, payloads, on_cleanup
        self.probe.instances.append(self)

    @property
    def probe(self) -> Probe:
        return self.probes.setdefault(self.name, Probe())

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {
            "name": self.name,
            "script": self.script,
            "payloads": self.payloads,
            "on_cleanup": self.on_cleanup,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.probe.runs += 1
        self.probe.started.set()
        if self.script == "raise":
            raise ValueError("boom")
        if self.script == "non_event":
            yield 42  # type: ignore[misc]
        if self.script in ("fire_and_wait", "fire_then_exit"):
            for payload in self.payloads:
                yield TriggerEvent(payload)
        if self.script in ("fire_and_wait", "wait"):
            await anyio.sleep(math.inf)

    async def cleanup(self) -> None:
        self.probe.cleanups += 1
        try:
            if self.on_cleanup == "raise":
                raise RuntimeError("cleanup broke")
            if self.on_cleanup == "hang":
                await anyio.sleep(math.inf)
        finally:
            self.probe.cleaned.set()

    def on_kill(self) -> None:
        self.probe.kills += 1


class ReturningTrigger(BaseTrigger):
    """The classic mistake: ``async def run()`` that returns the event."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {}

    async def run(self) -> TriggerEvent:  # type: ignore[override]
        return TriggerEvent("oops")


@pytest.fixture(autouse=True)
def _reset_probes():
    ScriptTrigger.probes.clear()
    yield
    ScriptTrigger.probes.clear()


def probe(name: str) -> Probe:
    return ScriptTrigger.probes.setdefault(name, Probe())


@asynccontextmanager
async def running(**kwargs: Any) -> AsyncIterator[tuple[TriggerRunner, Outbox]]:
    outbox = Outbox()
    kwargs.setdefault("restart_backoff_s", (0.001, 0.004))
    runner = TriggerRunner(outbox=outbox, **kwargs)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        yield runner, outbox
        await runner.aclose(grace_s=1.0)


async def wait_until(predicate: Callable[[], bool]) -> None:
    # Runner conditions (a task ended, a count reached) have no event to wait on: poll them
    # finely, bounded by each test's fail_after as well.
    await shared_wait_until(predicate, step=0.001)


def start(
    runner: TriggerRunner, trigger_id: int, trigger: BaseTrigger, kind: TriggerKind = TASK
) -> None:
    runner.start(TriggerSpec(trigger_id, trigger, kind))


async def next_item(outbox: Outbox) -> OutboxItem:
    [item] = await outbox.get_batch(1)
    return item


async def next_fired(outbox: Outbox) -> FiredEvent:
    item = await next_item(outbox)
    assert isinstance(item, FiredEvent), item
    return item


async def next_failed(outbox: Outbox) -> TriggerFailed:
    item = await next_item(outbox)
    assert isinstance(item, TriggerFailed), item
    return item


def fired_only(items: list[OutboxItem]) -> list[FiredEvent]:
    assert all(isinstance(i, FiredEvent) for i in items), items
    return [i for i in items if isinstance(i, FiredEvent)]


# -- events ------------------------------------------------------------------------------


async def test_task_trigger_fires_once_then_stops_and_cleans_up():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 7, ScriptTrigger("t", "fire_and_wait", payloads=("a", "b")))
            item = await next_fired(outbox)
            assert (item.trigger_id, item.event, item.seq) == (7, TriggerEvent("a"), None)
            await probe("t").cleaned.wait()
            await wait_until(lambda: 7 not in runner)
            assert len(outbox) == 0  # "b" was never taken: the generator was closed
            assert probe("t").instances[0].trigger_id == 7


async def test_watcher_events_flow_in_order_and_it_keeps_running():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 3, ScriptTrigger("w", "fire_and_wait", payloads=(1, 2, 3)), WATCHER)
            await wait_until(lambda: len(outbox) == 3)
            batch = fired_only(await outbox.get_batch())
            assert [(i.trigger_id, i.event.payload) for i in batch] == [(3, 1), (3, 2), (3, 3)]
            assert runner.running_ids() == frozenset({3})
            assert probe("w").cleanups == 0


# -- deduplication keys ------------------------------------------------------------------

OK: Any = {"status": "ok"}
KEYED_EVENTS: tuple[tuple[Any, str | None], ...] = ((OK, None), (OK, None), ("x", "k"))


class KeyedEvents(ReplayTrigger):
    def __init__(self, events: tuple[tuple[Any, str | None], ...] = KEYED_EVENTS) -> None:
        super().__init__(events)


class PayloadDeduped(KeyedEvents):
    dedup_by_payload = True


class Hooked(KeyedEvents):
    def dedup_key(self, event: TriggerEvent) -> str | None:
        return f"hook:{event.payload}"


class KeyedTask(BaseTrigger):
    """A deferred task's trigger: not an event trigger, so no dedup hook."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(OK, dedup_key="task-key")


@pytest.mark.parametrize(
    ("trigger", "keys"),
    [
        (KeyedEvents(), [None, None, "k"]),  # no key: not deduplicated
        (PayloadDeduped(), [payload_digest(OK), payload_digest(OK), "k"]),
        (Hooked(), [f"hook:{OK}", f"hook:{OK}", "hook:x"]),
    ],
)
async def test_a_fired_event_carries_the_key_of_its_triggers_dedup_hook(trigger, keys):
    # Computed where the event is taken: the persister needs nothing from the triggerer.
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 5, trigger, WATCHER)
            await wait_until(lambda: len(outbox) == 3)
            batch = fired_only(await outbox.get_batch())
    assert [i.dedup_key for i in batch] == keys


class RaisingHook(KeyedEvents):
    def dedup_key(self, event: TriggerEvent) -> str | None:
        raise ValueError("no key")


async def test_a_dedup_hook_that_raises_is_a_failure_of_its_trigger():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 8, RaisingHook())
            failure = await next_failed(outbox)
            assert (failure.trigger_id, failure.reason) == (8, "ValueError('no key')")
            assert len(outbox) == 0  # nothing fired


class AsyncHook(KeyedEvents):
    async def dedup_key(self, event: TriggerEvent) -> str | None:  # type: ignore[override]
        return "never awaited"


async def test_an_async_dedup_hook_is_a_failure_not_a_coroutine_key():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 9, AsyncHook())
            failure = await next_failed(outbox)
            assert failure.trigger_id == 9
            assert "dedup_key() returned coroutine" in failure.reason
            assert len(outbox) == 0  # nothing fired


async def test_a_task_triggers_event_carries_its_own_dedup_key():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 6, KeyedTask())
            assert (await next_fired(outbox)).dedup_key == "task-key"


# -- failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("raise", "ValueError('boom')"),
        ("exit", EXITED_WITHOUT_EVENT),
        ("non_event", "yielded int instead of a TriggerEvent"),
    ],
)
async def test_task_failures_are_reported_and_cleaned_up(script, reason):
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 11, ScriptTrigger("t", script))
            item = await next_failed(outbox)
            assert item == TriggerFailed(11, TASK, reason, item.traceback, will_restart=False)
            assert (item.traceback is not None) == (script == "raise")
            if item.traceback is not None:
                assert "ValueError: boom" in item.traceback
            await probe("t").cleaned.wait()
            await wait_until(lambda: 11 not in runner)


async def test_run_returning_an_event_is_a_failure_not_an_event():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 4, ReturningTrigger())
            item = await next_item(outbox)
            assert item == TriggerFailed(4, TASK, RETURNED_EVENT, None, will_restart=False)
            await wait_until(lambda: 4 not in runner)
            assert len(outbox) == 0


async def test_failure_is_logged_with_the_trigger_id(caplog):
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 12, ScriptTrigger("t", "raise"))
            await next_item(outbox)
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "trigger_failed"]
    assert record.trigger_id == 12
    assert record.will_restart is False


@pytest.mark.parametrize("on_cleanup", ["raise", "hang"])
async def test_broken_cleanup_is_logged_and_does_not_fail_a_fired_task(caplog, on_cleanup):
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    with anyio.fail_after(5):
        async with running(cleanup_timeout_s=0.05) as (runner, outbox):
            start(runner, 21, ScriptTrigger("t", "fire_and_wait", on_cleanup=on_cleanup))
            await next_fired(outbox)
            await wait_until(lambda: 21 not in runner)
            assert len(outbox) == 0
    action = "trigger_cleanup_failed" if on_cleanup == "raise" else "trigger_cleanup_timeout"
    [record] = [r for r in caplog.records if getattr(r, "action", None) == action]
    assert record.trigger_id == 21
    assert probe("t").cleanups == 1


async def test_watcher_ending_is_a_failure_and_it_restarts_as_a_fresh_instance():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 5, ScriptTrigger("w", "fire_then_exit", payloads=("x",)), WATCHER)
            await wait_until(lambda: probe("w").runs >= 3)
            runner.stop(5)
            await wait_until(lambda: 5 not in runner)
            items = await outbox.get_batch()
    fired = [i for i in items if isinstance(i, FiredEvent)]
    failed = [i for i in items if isinstance(i, TriggerFailed)]
    assert len(fired) >= 3
    assert {i.event for i in fired} == {TriggerEvent("x")}
    assert len(failed) >= 2
    assert all(f == TriggerFailed(5, WATCHER, WATCHER_EXITED, None, True) for f in failed)
    instances = probe("w").instances
    assert len({id(i) for i in instances}) == len(instances) >= 3
    assert all(i == instances[0] for i in instances)  # same kwargs, fresh objects
    assert probe("w").cleanups == probe("w").runs  # one cleanup per attempt


async def test_restart_uses_the_class_the_trigger_serializes_as():
    class SerializesAsBase(ScriptTrigger):
        def serialize(self) -> tuple[str, dict[str, Any]]:
            _, kwargs = super().serialize()
            return classpath_of(ScriptTrigger), kwargs

    with anyio.fail_after(5):
        async with running() as (runner, _):
            start(runner, 16, SerializesAsBase(name="w", script="exit"), WATCHER)
            await wait_until(lambda: probe("w").runs >= 2)
            runner.stop(16)
    assert [type(i) for i in probe("w").instances[:2]] == [SerializesAsBase, ScriptTrigger]


async def test_watcher_restart_backoff_doubles_and_resets_after_a_healthy_run(caplog):
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    now = [0.0]

    class ClockJumper(ScriptTrigger):
        async def run(self) -> AsyncIterator[TriggerEvent]:
            if self.probe.runs == 4:
                now[0] += 1000.0  # the fifth attempt runs "healthy" for a long time
            async for event in super().run():
                yield event

    with anyio.fail_after(5):
        async with running(
            restart_backoff_s=(0.001, 0.004), healthy_run_s=60.0, clock=lambda: now[0]
        ) as (runner, _):
            start(runner, 6, ClockJumper(name="w", script="raise"), WATCHER)
            await wait_until(lambda: probe("w").runs >= 7)
            runner.stop(6)
            await wait_until(lambda: 6 not in runner)
    failures = [r for r in caplog.records if getattr(r, "action", None) == "trigger_failed"]
    assert all(r.trigger_id == 6 and r.will_restart for r in failures)
    assert [r.backoff_s for r in failures][:6] == [0.001, 0.002, 0.004, 0.004, 0.001, 0.002]
    # The same failure again is one line with its count; a new streak starts with the traceback.
    assert [r.failures_in_row for r in failures][:6] == [1, 2, 3, 4, 1, 2]
    assert ["Traceback" in r.getMessage() for r in failures][:6] == [
        True, False, False, False, True, False
    ]  # fmt: skip
    assert "(2 times in a row)" in failures[1].getMessage()


async def test_watcher_that_cannot_be_recreated_is_reported_without_restart():
    class OneShot(ScriptTrigger):
        def __init__(self, **kwargs: Any) -> None:
            if probe("w").instances:
                raise TypeError("kwargs changed shape")
            super().__init__(**kwargs)

    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 8, OneShot(name="w", script="exit"), WATCHER)
            first = await next_item(outbox)
            second = await next_item(outbox)
            await wait_until(lambda: 8 not in runner)
    assert first == TriggerFailed(8, WATCHER, WATCHER_EXITED, None, will_restart=True)
    assert isinstance(second, TriggerFailed)
    assert not second.will_restart
    assert second.reason.startswith("could not re-create the trigger to restart it: TypeError")


# -- stop, kill, cancellation, shutdown --------------------------------------------------


@pytest.mark.parametrize("kill", [False, True])
async def test_stop_cancels_cleans_up_and_kills_only_when_asked(kill, caplog):
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 9, ScriptTrigger("t", "wait"))
            await probe("t").started.wait()
            runner.stop(9, kill=kill)
            await probe("t").cleaned.wait()
            await wait_until(lambda: 9 not in runner)
            assert len(outbox) == 0  # cancellation is not a failure
    assert probe("t").kills == (1 if kill else 0)
    assert probe("t").cleanups == 1
    assert not [r for r in caplog.records if getattr(r, "action", None) == "trigger_failed"]


async def test_stop_before_the_task_ran_never_runs_the_trigger():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 13, ScriptTrigger("t", "fire_and_wait"))
            runner.stop(13)
            await wait_until(lambda: 13 not in runner)
            assert len(outbox) == 0
    assert probe("t").runs == probe("t").cleanups == 0


async def test_on_kill_raising_is_logged_and_the_trigger_still_stops(caplog):
    class BadKill(ScriptTrigger):
        def on_kill(self) -> None:
            raise RuntimeError("kill broke")

    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 14, BadKill(name="t", script="wait"))
            await probe("t").started.wait()
            runner.stop(14, kill=True)
            await wait_until(lambda: 14 not in runner)
            assert len(outbox) == 0
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == ["trigger_on_kill_failed"]
    assert probe("t").cleanups == 1


async def test_an_async_on_kill_is_reported_not_silently_skipped(caplog):
    class AsyncKill(ScriptTrigger):
        async def on_kill(self) -> None:  # type: ignore[override]
            self.probe.kills += 1

    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 15, AsyncKill(name="t", script="wait"))
            await probe("t").started.wait()
            runner.stop(15, kill=True)
            await wait_until(lambda: 15 not in runner)
            assert len(outbox) == 0
    [record] = [r for r in caplog.records if getattr(r, "action", None)]
    assert (record.action, record.trigger_id) == ("trigger_on_kill_failed", 15)
    assert "async def" in record.getMessage()
    assert probe("t").kills == 0 and probe("t").cleanups == 1


async def test_report_failure_puts_a_non_restarting_failure():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            runner.report_failure(15, WATCHER, "could not load", traceback="tb")
            assert await next_item(outbox) == TriggerFailed(
                15, WATCHER, "could not load", "tb", False
            )


async def test_stop_during_a_watcher_backoff_ends_it_without_another_attempt():
    with anyio.fail_after(5):
        async with running(restart_backoff_s=(60.0, 60.0)) as (runner, outbox):
            start(runner, 10, ScriptTrigger("w", "exit"), WATCHER)
            assert isinstance(await next_item(outbox), TriggerFailed)
            await anyio.wait_all_tasks_blocked()
            runner.stop(10)
            await wait_until(lambda: 10 not in runner)
    assert probe("w").runs == 1


async def test_start_is_idempotent_and_unknown_stops_are_ignored():
    with anyio.fail_after(5):
        async with running() as (runner, _):
            trigger = ScriptTrigger("t", "wait")
            start(runner, 1, trigger)
            start(runner, 1, ScriptTrigger("other", "wait"))
            runner.stop(999)
            await probe("t").started.wait()
            await anyio.wait_all_tasks_blocked()
            assert len(runner) == 1 and 1 in runner
            assert "other" not in ScriptTrigger.probes or probe("other").runs == 0


async def test_restart_of_a_stopping_trigger_waits_for_its_cleanup():
    with anyio.fail_after(5):
        async with running() as (runner, _):
            release = anyio.Event()

            class SlowCleanup(ScriptTrigger):
                async def cleanup(self) -> None:
                    await release.wait()
                    await super().cleanup()

            start(runner, 2, SlowCleanup(name="old", script="wait"))
            await probe("old").started.wait()
            runner.stop(2)
            start(runner, 2, ScriptTrigger("new", "wait"))
            await anyio.wait_all_tasks_blocked()
            assert probe("new").runs == 0  # still waiting for the old attempt to end
            assert 2 in runner
            release.set()
            await probe("new").started.wait()
            assert probe("old").cleanups == 1
            assert runner.running_ids() == frozenset({2})


async def test_external_cancellation_propagates_and_is_not_a_failure():
    with anyio.fail_after(5):
        outbox = Outbox()
        runner = TriggerRunner(outbox=outbox)
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            start(runner, 1, ScriptTrigger("t", "wait"))
            await probe("t").started.wait()
            tg.cancel_scope.cancel()
        assert probe("t").cleanups == 1
        assert len(outbox) == 0
        assert len(runner) == 0


async def test_aclose_stops_everything_within_the_grace():
    with anyio.fail_after(5):
        outbox = Outbox()
        runner = TriggerRunner(outbox=outbox, cleanup_timeout_s=30.0)
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            start(runner, 1, ScriptTrigger("hang", "wait", on_cleanup="hang"))
            start(runner, 2, ScriptTrigger("ok", "wait"))
            await probe("hang").started.wait()
            await probe("ok").started.wait()
            before = anyio.current_time()
            await runner.aclose(grace_s=0.1)
            assert anyio.current_time() - before < 1.0
            assert len(runner) == 0
        assert probe("ok").cleanups == probe("hang").cleanups == 1
        assert len(outbox) == 0
        with pytest.raises(RuntimeError):
            await runner.run()


async def test_start_outside_run_is_an_error_and_after_aclose_a_no_op():
    with anyio.fail_after(5):
        runner = TriggerRunner(outbox=Outbox())
        assert "idle" in repr(runner)
        with pytest.raises(RuntimeError, match="run"):
            start(runner, 1, ScriptTrigger("t", "wait"))
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            closing = anyio.Event()

            async def close() -> None:
                closing.set()
                await runner.aclose(grace_s=0.5)

            tg.start_soon(close)
            await closing.wait()
            start(runner, 1, ScriptTrigger("t", "wait"))
            assert len(runner) == 0
        assert "closed triggers=0" in repr(runner)
        # run() has ended too: a claim round of a stopping triggerer that ends only now
        start(runner, 2, ScriptTrigger("t", "wait"))
        assert len(runner) == 0


async def test_two_thousand_triggers_start_and_stop_quickly():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            for i in range(2000):
                start(runner, i, ScriptTrigger("many", "wait"))
            await wait_until(lambda: probe("many").runs == 2000)
            assert len(runner) == 2000
            for i in range(0, 2000, 2):
                runner.stop(i)
            await wait_until(lambda: len(runner) == 1000)
            assert runner.running_ids() == frozenset(range(1, 2000, 2))
        assert probe("many").cleanups == 2000
        assert len(outbox) == 0


# -- native tasks: cleanup not interrupted, scopes inside triggers, crashes, stragglers ---


class SlowCleanup(ScriptTrigger):
    """Its cleanup waits for ``release``; ``outcome`` says whether it finished or was cancelled."""

    release: ClassVar[anyio.Event]
    outcome: ClassVar[list[str]]

    async def cleanup(self) -> None:
        self.probe.cleaned.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.outcome.append("cancelled")
            raise
        self.outcome.append("finished")
        self.probe.cleanups += 1


@pytest.fixture
def slow_cleanup():
    SlowCleanup.release = anyio.Event()
    SlowCleanup.outcome = []
    return SlowCleanup


@pytest.mark.parametrize(
    ("script", "kind"), [("fire_and_wait", TASK), ("exit", WATCHER), ("raise", TASK)]
)
async def test_stop_during_cleanup_lets_the_cleanup_finish_and_never_restarts(
    slow_cleanup, script, kind
):
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 3, slow_cleanup(name="t", script=script), kind)
            await probe("t").cleaned.wait()
            runner.stop(3)
            await anyio.wait_all_tasks_blocked()
            assert 3 in runner  # still cleaning up, not cancelled
            slow_cleanup.release.set()
            await wait_until(lambda: 3 not in runner)
            items = await outbox.get_batch()
    assert slow_cleanup.outcome == ["finished"]
    assert probe("t").runs == 1  # a stopped watcher is not restarted
    assert len(items) == 1  # the event, or the failure that ended the attempt
    assert isinstance(items[0], FiredEvent if script == "fire_and_wait" else TriggerFailed)


class ScopedTrigger(BaseTrigger):
    """Uses anyio cancel scopes and a task group inside ``run()``."""

    child_cancelled: ClassVar[list[bool]] = []

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"mode": self.mode}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if self.mode == "timeout":
            with anyio.move_on_after(0.01) as scope:
                await anyio.sleep_forever()
            yield TriggerEvent(scope.cancelled_caught)
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._child)
            probe("scoped").started.set()
            await anyio.sleep_forever()
        yield TriggerEvent("unreachable")

    async def _child(self) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            self.child_cancelled.append(True)


async def test_cancel_scope_deadlines_work_inside_a_trigger():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 1, ScopedTrigger("timeout"))
            item = await next_fired(outbox)
    assert item.event == TriggerEvent(True)


async def test_stop_cancels_a_task_group_inside_a_trigger():
    ScopedTrigger.child_cancelled.clear()
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 1, ScopedTrigger("task_group"))
            await probe("scoped").started.wait()
            await anyio.wait_all_tasks_blocked()
            runner.stop(1)
            await wait_until(lambda: 1 not in runner)
            assert len(outbox) == 0
    assert ScopedTrigger.child_cancelled == [True]


async def test_a_crash_of_the_runtime_stops_every_trigger_and_is_raised_by_run(caplog):
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    broken = False

    def clock() -> float:  # an injected dependency of the runtime, outside user code
        if broken:
            raise RuntimeError("clock broke")
        return 0.0

    runner = TriggerRunner(outbox=Outbox(), clock=clock)
    with anyio.fail_after(5), pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            start(runner, 1, ScriptTrigger("bystander", "wait"))
            await probe("bystander").started.wait()
            broken = True
            start(runner, 2, ScriptTrigger("doomed", "wait"))
            await anyio.sleep_forever()
    assert caught.group_contains(RuntimeError, match="clock broke", depth=2)
    assert probe("bystander").cleanups == 1
    assert "doomed" not in ScriptTrigger.probes or probe("doomed").runs == 0
    assert len(runner) == 0
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "runner_task_crashed"]
    assert record.trigger_id == 2


class Stubborn(ScriptTrigger):
    """Swallows the first cancellation (a trigger bug), then waits again."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.probe.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.probe.kills += 1  # counts swallowed cancellations
        await anyio.sleep_forever()
        yield TriggerEvent("never")


async def test_a_trigger_that_swallows_cancellation_is_cancelled_again_at_shutdown():
    with anyio.fail_after(5):
        outbox = Outbox()
        runner = TriggerRunner(outbox=outbox)
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            start(runner, 1, Stubborn(name="t", script="wait"))
            await probe("t").started.wait()
            runner.stop(1)
            await wait_until(lambda: probe("t").kills == 1)
            assert 1 in runner  # it swallowed the stop
            await runner.aclose(grace_s=0.05)
            assert len(runner) == 0
    assert probe("t").cleanups == 1
    assert len(outbox) == 0


async def test_a_restart_stopped_while_waiting_keeps_the_old_attempt_tracked(slow_cleanup):
    with anyio.fail_after(5):
        async with running() as (runner, _):
            start(runner, 2, slow_cleanup(name="old", script="wait"))
            await probe("old").started.wait()
            runner.stop(2)
            start(runner, 2, ScriptTrigger("mid", "wait"))
            await anyio.wait_all_tasks_blocked()
            runner.stop(2)  # stops "mid" while it waits for "old" to clean up
            await anyio.wait_all_tasks_blocked()
            assert 2 in runner  # "old" still cleans up: still a live attempt of trigger 2
            start(runner, 2, ScriptTrigger("new", "wait"))
            await anyio.wait_all_tasks_blocked()
            assert probe("new").runs == 0
            slow_cleanup.release.set()
            await probe("new").started.wait()
            assert runner.running_ids() == frozenset({2})
    assert "mid" not in ScriptTrigger.probes or probe("mid").runs == 0
    assert slow_cleanup.outcome == ["finished"]


# -- shared streams ----------------------------------------------------------------------


class FakeSharedStreams:
    """Implements the three calls the runner makes on a SharedStreamManager."""

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Any](10)
        self.calls: list[tuple[Any, ...]] = []
        self.next_seq = 100

    def subscribe(
        self, *, trigger_id: int, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]:
        self.calls.append(("subscribe", trigger_id, key))
        return self._stream()

    async def _stream(self) -> AsyncIterator[Any]:
        async for raw in self.receive:
            yield raw

    def bind_pending_event(self, *, trigger_id: int, key: Hashable) -> int | None:
        self.next_seq += 1
        self.calls.append(("bind", trigger_id, key, self.next_seq))
        return self.next_seq

    async def unsubscribe(self, trigger_id: int, key: Hashable, *, failed: bool = False) -> None:
        await anyio.lowlevel.checkpoint()
        self.calls.append(("unsubscribe failed" if failed else "unsubscribe", trigger_id, key))


class SharedTrigger(BaseEventTrigger):
    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"topic": self.topic}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise AssertionError("a shared-stream trigger must not run its own run()")
        yield

    def shared_stream_key(self) -> Hashable:
        return ("topic", self.topic)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            if raw % 2 == 0:  # odd raw events are not for this trigger
                yield TriggerEvent(raw)


async def test_shared_stream_events_are_bound_to_a_seq_and_unsubscribed_at_the_end():
    shared = FakeSharedStreams()
    key = ("topic", "orders")
    with anyio.fail_after(5), shared.send, shared.receive:
        async with running(shared_streams=shared) as (runner, outbox):
            start(runner, 30, SharedTrigger("orders"), WATCHER)
            for raw in (2, 3, 4):
                await shared.send.send(raw)
            await wait_until(lambda: len(outbox) == 2)
            batch = fired_only(await outbox.get_batch())
            assert [(i.event.payload, i.seq) for i in batch] == [(2, 101), (4, 102)]
            runner.stop(30)
            await wait_until(lambda: 30 not in runner)
    assert shared.calls == [
        ("subscribe", 30, key),
        ("bind", 30, key, 101),
        ("bind", 30, key, 102),
        ("unsubscribe", 30, key),
    ]


class RaisingFilterTrigger(SharedTrigger):
    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            raise ValueError(f"cannot parse {raw}")
            yield TriggerEvent(raw)


async def test_a_filter_that_raises_unsubscribes_as_failed():
    shared = FakeSharedStreams()
    key = ("topic", "orders")
    with anyio.fail_after(5), shared.send, shared.receive:
        async with running(shared_streams=shared) as (runner, outbox):
            start(runner, 32, RaisingFilterTrigger("orders"), WATCHER)
            await shared.send.send(7)
            item = await next_item(outbox)
            runner.stop(32)
    assert isinstance(item, TriggerFailed)
    assert "cannot parse 7" in item.reason
    assert shared.calls[:2] == [("subscribe", 32, key), ("unsubscribe failed", 32, key)]


async def test_shared_stream_is_not_used_without_a_manager():
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 31, SharedTrigger("orders"), WATCHER)
            item = await next_item(outbox)
            runner.stop(31)
    assert isinstance(item, TriggerFailed)
    assert "must not run its own run()" in item.reason


class AckTopicTrigger(BaseEventTrigger):
    """An ack-mode event trigger over the in-memory producer of its topic."""

    producers: ClassVar[dict[str, InMemoryProducer]] = {}

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"topic": self.topic}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise AssertionError("a shared-stream trigger must not run its own run()")
        yield

    def shared_stream_key(self) -> Hashable:
        return ("ack-topic", self.topic)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> InMemoryProducer:
        return cls.producers[kwargs["topic"]]

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            if raw % 2 == 0:
                yield TriggerEvent(raw)


async def test_real_manager_ack_mode_advances_only_after_confirm_and_stops_with_the_triggers():
    producer = InMemoryProducer()
    AckTopicTrigger.producers["orders"] = producer
    with anyio.fail_after(5):
        async with (
            SharedStreamManager() as manager,
            running(shared_streams=manager) as (
                runner,
                outbox,
            ),
        ):
            start(runner, 1, AckTopicTrigger("orders"), WATCHER)
            start(runner, 2, AckTopicTrigger("orders"), WATCHER)
            await producer.wait_opened()
            await producer.put(2, "p2")
            await producer.put(3, "p3")
            await wait_until(lambda: len(outbox) == 2)
            batch = fired_only(await outbox.get_batch())
            assert sorted((i.trigger_id, i.event.payload) for i in batch) == [(1, 2), (2, 2)]
            seqs = [i.seq for i in batch if i.seq is not None]
            assert len(set(seqs)) == 2
            await anyio.wait_all_tasks_blocked()
            assert producer.advanced == []  # nothing is advanced before it is persisted
            manager.confirm_persisted(seqs)
            await producer.wait_for_advanced(2)
            assert producer.advanced_payloads == ["p2", "p3"]
            runner.stop(1)
            runner.stop(2)
            await producer.wait_closed()  # the last unsubscribe stopped the group
            await wait_until(lambda: len(runner) == 0)
    AckTopicTrigger.producers.clear()


class UnreachableTrigger(BaseTrigger):
    """Its upstream is down (a producer's ``UpstreamUnavailable``), or it fails otherwise."""

    def __init__(self, how: str = "down") -> None:
        super().__init__()
        self.how = how

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"how": self.how}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if self.how == "down":
            raise UpstreamUnavailable("the broker is down", address="mq.internal:5672")
        raise ValueError("bad payload")
        yield TriggerEvent(None)  # pragma: no cover - makes run() a generator


async def test_a_failure_to_reach_the_upstream_names_what_and_where_for_the_store():
    """Without a shared-stream key the trigger class names what it reads; a failure of
    another kind carries no upstream (the store then forgets the last one)."""
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            start(runner, 5, UnreachableTrigger(), WATCHER)
            down = await next_failed(outbox)
            start(runner, 6, UnreachableTrigger("bad"), WATCHER)
            other = await next_failed(outbox)
            while other.trigger_id != 6:  # trigger 5 keeps failing (and restarting)
                other = await next_failed(outbox)
    assert down.trigger_id == 5 and down.will_restart
    assert (down.unreachable_broker, down.unreachable_address) == (
        "UnreachableTrigger",
        "mq.internal:5672",
    )
    assert (other.unreachable_broker, other.unreachable_address) == (None, None)
