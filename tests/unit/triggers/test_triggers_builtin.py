"""Behaviour of the built-in triggers and of the ``triggers.testing`` helpers."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import watchfiles

from tests.waiting import wait_until
from triggers import (
    BaseEventTrigger,
    BaseTrigger,
    DateTimeTrigger,
    DirectoryFileDeleteTrigger,
    DirectoryWatchTrigger,
    FileDeleteTrigger,
    FileTrigger,
    SerializationError,
    TaskSuccessEvent,
    TimeDeltaTrigger,
    TriggerContractError,
    TriggerEvent,
    classpath_of,
    temporal,
)
from triggers import file as file_module
from triggers import watch as watch_module
from triggers.file import LISTING_STATS, file_dedup_key
from triggers.testing import ManualTrigger, collect_events, run_trigger_until_event
from triggers.watch import RECENT_WRITES_MAX, _RecentWrites

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream


@pytest.fixture(autouse=True)
def _fresh_manual_channels() -> Any:
    ManualTrigger.reset()
    yield
    ManualTrigger.reset()


# --- time -----------------------------------------------------------------------------------


async def test_date_time_trigger_in_the_past_fires_at_once() -> None:
    moment = datetime.now(UTC) - timedelta(days=1)
    event = await run_trigger_until_event(DateTimeTrigger(moment), timeout=1)
    assert event == TriggerEvent(moment)


async def test_date_time_trigger_fires_at_its_moment() -> None:
    moment = datetime.now(UTC) + timedelta(milliseconds=50)
    event = await run_trigger_until_event(DateTimeTrigger(moment), timeout=2)
    assert datetime.now(UTC) >= moment
    assert event.payload == moment


async def test_time_delta_trigger_fires_with_its_computed_moment() -> None:
    trigger = TimeDeltaTrigger(timedelta(milliseconds=20))
    event = await run_trigger_until_event(trigger, timeout=2)
    assert event.payload == trigger.moment
    assert datetime.now(UTC) >= trigger.moment


async def test_end_from_trigger_yields_task_success() -> None:
    trigger = DateTimeTrigger(datetime.now(UTC), end_from_trigger=True)
    event = await run_trigger_until_event(trigger, timeout=1)
    assert isinstance(event, TaskSuccessEvent)
    assert event.payload == {"state": "success", "xcoms": {}}


async def test_date_time_trigger_sleeps_for_the_whole_wait_not_in_a_poll_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    sleeps: list[float] = []
    loop = asyncio.get_running_loop()

    def fake_wake_after(delay_s: float) -> tuple[asyncio.Future[None], asyncio.TimerHandle]:
        sleeps.append(delay_s)
        # The first wake-up comes early (clock drift): the trigger must sleep again.
        now[0] += timedelta(seconds=delay_s / 2 if len(sleeps) == 1 else delay_s)
        waiter: asyncio.Future[None] = loop.create_future()
        waiter.set_result(None)
        return waiter, loop.call_later(delay_s, lambda: None)

    monkeypatch.setattr(temporal, "utcnow", lambda: now[0])
    monkeypatch.setattr(temporal, "_wake_after", fake_wake_after)
    trigger = DateTimeTrigger(now[0] + timedelta(hours=1))
    event = await run_trigger_until_event(trigger, timeout=1)
    assert sleeps == [3600.0, 1800.0]
    assert event.payload == trigger.moment


async def test_a_cancelled_date_time_trigger_leaves_no_timer_behind() -> None:
    trigger = DateTimeTrigger(datetime.now(UTC) + timedelta(days=1))
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    with pytest.raises(TimeoutError):
        await run_trigger_until_event(trigger, timeout=0.05)
    await asyncio.sleep(0)
    assert sum(not h.cancelled() for h in loop._scheduled) <= before  # type: ignore[attr-defined]


# --- FileTrigger / FileDeleteTrigger ----------------------------------------------------------


async def test_file_trigger_fires_on_a_recursive_glob(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.csv").write_text("b")
    (tmp_path / "a.csv").write_text("a")
    (tmp_path / "x.txt").write_text("x")
    (tmp_path / "dir.csv").mkdir()  # a directory is not a match
    trigger = FileTrigger(str(tmp_path / "**" / "*.csv"), recursive=True, poke_interval=0.01)
    event = await run_trigger_until_event(trigger, timeout=2)
    expected = sorted([str(tmp_path / "a.csv"), str(tmp_path / "sub" / "b.csv")])
    assert event.payload == {"filepath": expected[0], "matches": expected}


async def test_file_trigger_polls_until_a_match_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.txt").write_text("not a match")
    target = tmp_path / "late.csv"
    real_glob = file_module._glob_files
    calls: list[str] = []

    def glob_then_create(pattern: str, recursive: bool) -> list[str]:
        calls.append(pattern)
        if len(calls) == 3:
            target.write_text("now")
        return real_glob(pattern, recursive)

    monkeypatch.setattr(file_module, "_glob_files", glob_then_create)
    trigger = FileTrigger(str(tmp_path / "*.csv"), poke_interval=0.01)
    event = await run_trigger_until_event(trigger, timeout=2)
    assert len(calls) == 3
    assert event.payload == {"filepath": str(target), "matches": [str(target)]}


async def test_file_delete_trigger_deletes_fires_and_keeps_watching(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    flag.write_text("1")
    os.utime(flag, ns=(1_000_000_000, 1_000_000_000))
    trigger = FileDeleteTrigger(str(flag), poke_interval=0.01)
    run = trigger.run()
    assert isinstance(run, AsyncGenerator)
    with anyio.fail_after(5):
        async with aclosing(run):
            first = await anext(run)
            assert not flag.exists()
            flag.write_text("2")
            os.utime(flag, ns=(2_000_000_000, 2_000_000_000))
            second = await anext(run)
    assert not flag.exists()
    assert first.payload == {"filepath": str(flag), "mtime": 1.0}
    assert second.payload == {"filepath": str(flag), "mtime": 2.0}
    # Keyed by the file's identity, mtime and size: equal payloads would still be two events.
    assert first.dedup_key is not None and first.dedup_key.startswith("file:")
    assert first.dedup_key.endswith(f":1000000000:1:{flag}")
    assert second.dedup_key is not None and second.dedup_key.endswith(f":2000000000:1:{flag}")


async def test_file_delete_trigger_tolerates_the_file_vanishing_before_unlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "flag"
    flag.write_text("x")
    real_unlink = os.unlink
    unlinks: list[str] = []

    def vanish_once(path: Any, *args: Any, **kwargs: Any) -> None:
        unlinks.append(os.fspath(path))
        if len(unlinks) == 1:
            raise FileNotFoundError(path)  # someone else took it between stat and unlink
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", vanish_once)
    events = await collect_events(FileDeleteTrigger(str(flag), poke_interval=0.01), 1, timeout=2)
    assert unlinks == [str(flag), str(flag)]
    assert [event.payload["filepath"] for event in events] == [str(flag)]


# --- DirectoryFileDeleteTrigger: one listing per cadence for the whole group -----------------


async def fan_out(
    source: AsyncGenerator[Any, None], sends: list[MemoryObjectSendStream[Any]], stop: anyio.Event
) -> int:
    """A tiny tee: one shared generator, every snapshot to every subscriber."""
    received = 0
    async with aclosing(source):
        async for snapshot in source:
            received += 1
            for send in sends:
                await send.send(snapshot)
            if stop.is_set():
                break
    for send in sends:
        await send.aclose()
    return received


async def subscribe(
    trigger: DirectoryFileDeleteTrigger,
    receive: MemoryObjectReceiveStream[Any],
    out: MemoryObjectSendStream[TriggerEvent],
) -> None:
    async with receive, out, aclosing(trigger.filter_shared_stream(receive)) as events:
        async for event in events:
            await out.send(event)


async def test_siblings_share_one_listing_per_cadence(tmp_path: Path) -> None:
    directory = str(tmp_path)
    for name in ("a.flag", "b.flag", "unrelated.flag"):
        (tmp_path / name).write_text(name)
    triggers = [DirectoryFileDeleteTrigger(directory, f"{n}.flag", 0.01) for n in "abc"]
    kwargs = triggers[0].serialize()[1]
    raw = [anyio.create_memory_object_stream[Any](16) for _ in triggers]
    fired = [anyio.create_memory_object_stream[TriggerEvent](16) for _ in triggers]
    (a_events, b_events, c_events) = (receive for _, receive in fired)
    stop = anyio.Event()
    cadences: list[int] = []
    before = LISTING_STATS.count(directory)

    async def tee() -> None:
        source = DirectoryFileDeleteTrigger.open_shared_stream(kwargs)
        cadences.append(await fan_out(source, [send for send, _ in raw], stop))

    with anyio.fail_after(5), a_events, b_events, c_events:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tee)
            for trigger, (_, receive), (send, _) in zip(triggers, raw, fired, strict=True):
                tg.start_soon(subscribe, trigger, receive, send)
            a1, b1 = await a_events.receive(), await b_events.receive()
            (tmp_path / "c.flag").write_text("c")
            c1 = await c_events.receive()
            (tmp_path / "a.flag").write_text("again")
            os.utime(tmp_path / "a.flag", ns=(5_000_000_000, 5_000_000_000))
            a2 = await a_events.receive()
            stop.set()

    assert a1.payload == {
        "directory": directory,
        "filename": "a.flag",
        "filepath": str(tmp_path / "a.flag"),
    }
    assert b1.payload["filename"] == "b.flag"
    assert c1.payload["filename"] == "c.flag"
    assert a2.payload == a1.payload
    assert a2.dedup_key is not None and a2.dedup_key.startswith("file:")
    assert a2.dedup_key.endswith(f":5000000000:5:{tmp_path / 'a.flag'}")
    assert a1.dedup_key != a2.dedup_key
    assert sorted(os.listdir(tmp_path)) == ["unrelated.flag"]
    assert cadences[0] >= 3
    assert LISTING_STATS.count(directory) - before == cadences[0]


async def test_filter_fires_nothing_for_a_file_already_taken(tmp_path: Path) -> None:
    trigger = DirectoryFileDeleteTrigger(str(tmp_path), "a.flag", 0.01)
    snapshot = {"directory": str(tmp_path), "names": ["a.flag"]}

    async def snapshots() -> AsyncIterator[dict[str, Any]]:
        yield snapshot  # listed, but a sibling or a previous round removed it already
        (tmp_path / "a.flag").write_text("x")
        yield snapshot

    with anyio.fail_after(5):
        events = [event async for event in trigger.filter_shared_stream(snapshots())]
    assert [event.payload["filename"] for event in events] == ["a.flag"]


async def test_directory_trigger_runs_alone_without_the_manager(tmp_path: Path) -> None:
    (tmp_path / "mine.flag").write_text("x")
    (tmp_path / "other.flag").write_text("x")
    before = LISTING_STATS.count(str(tmp_path))
    trigger = DirectoryFileDeleteTrigger(str(tmp_path), "mine.flag", poke_interval=0.01)
    event = await run_trigger_until_event(trigger, timeout=2)
    assert event.payload["filepath"] == str(tmp_path / "mine.flag")
    assert sorted(os.listdir(tmp_path)) == ["other.flag"]
    assert LISTING_STATS.count(str(tmp_path)) - before == 1


def _presence_records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.__dict__["action"])
        for r in caplog.records
        if r.__dict__.get("action", "").startswith("watch_directory_")
    ]


async def test_missing_directory_lists_as_empty_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="triggers")
    kwargs = {"directory": str(tmp_path / "later"), "poke_interval": 0.01}
    with anyio.fail_after(5):
        async with aclosing(DirectoryFileDeleteTrigger.open_shared_stream(kwargs)) as stream:
            for _ in range(5):  # several listings of the missing directory: one warning
                assert await anext(stream) == {"directory": kwargs["directory"], "names": []}
            (tmp_path / "later").mkdir()
            (tmp_path / "later" / "f").write_text("x")
            (tmp_path / "later" / "sub").mkdir()
            assert (await anext(stream))["names"] == ["f"]
            assert (await anext(stream))["names"] == ["f"]
    assert _presence_records(caplog) == [
        ("WARNING", "watch_directory_missing"),
        ("INFO", "watch_directory_appeared"),
    ]
    (warning, _appeared) = [r for r in caplog.records if "directory" in r.__dict__]
    assert kwargs["directory"] in warning.getMessage()
    assert "DirectoryFileDeleteTrigger" in warning.getMessage()


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Wrap ``module.name`` to count its calls; returns the one-item counter."""
    calls = [0]
    original = getattr(module, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


async def test_file_delete_trigger_says_once_that_its_directory_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="triggers")
    pokes = _count_calls(monkeypatch, file_module, "_watched_file_state")
    flag = tmp_path / "later" / "go.flag"
    trigger = FileDeleteTrigger(str(flag), poke_interval=0.01)
    with anyio.fail_after(10):
        async with aclosing(trigger.run()) as run:

            async def create_after_some_pokes() -> None:
                await wait_until(lambda: pokes[0] >= 5)  # several pokes, one warning
                flag.parent.mkdir()
                flag.write_text("x")

            async with anyio.create_task_group() as tg:
                tg.start_soon(create_after_some_pokes)
                event = await anext(run)
    assert event.payload["filepath"] == str(flag)
    assert _presence_records(caplog) == [
        ("WARNING", "watch_directory_missing"),
        ("INFO", "watch_directory_appeared"),
    ]


# --- DirectoryWatchTrigger -------------------------------------------------------------------


async def test_watch_trigger_sees_a_created_file_and_ignores_other_names(tmp_path: Path) -> None:
    trigger = DirectoryWatchTrigger(str(tmp_path), "*.csv", debounce_ms=20)
    seen = anyio.Event()
    found: list[TriggerEvent] = []

    async def watch() -> None:
        found.append(await run_trigger_until_event(trigger, timeout=4))
        seen.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            # The watch starts asynchronously: write until it reports (a bounded retry).
            attempt = 0
            while not seen.is_set():
                (tmp_path / f"a-{attempt}.txt").write_text("ignored: sorts first")
                (tmp_path / f"data-{attempt}.part").write_text("x")
                os.rename(tmp_path / f"data-{attempt}.part", tmp_path / f"data-{attempt}.csv")
                attempt += 1
                with anyio.move_on_after(0.1):
                    await seen.wait()
    payload = found[0].payload
    assert payload["path"].startswith(str(tmp_path / "data-"))
    assert payload["path"].endswith(".csv")
    assert payload["change"] == "added"


async def test_watch_trigger_keeps_files_that_exist_once_per_write(tmp_path: Path) -> None:
    trigger = DirectoryWatchTrigger(str(tmp_path), "*.csv")
    kept, gone, other = tmp_path / "kept.csv", str(tmp_path / "gone.csv"), tmp_path / "o.txt"
    kept.write_text("x")
    other.write_text("x")
    (tmp_path / "dir.csv").mkdir()
    os.utime(kept, ns=(7_000_000_000, 7_000_000_000))
    changes = {
        (watchfiles.Change.modified, str(kept)),
        (watchfiles.Change.added, gone),
        (watchfiles.Change.deleted, gone),
        (watchfiles.Change.added, str(other)),
        (watchfiles.Change.added, str(tmp_path / "dir.csv")),
    }
    recent = _RecentWrites(RECENT_WRITES_MAX)
    with anyio.fail_after(5):
        first = await trigger._events_for(changes, recent)
        first_key = file_dedup_key(str(kept), os.stat(kept))
        again = await trigger._events_for({(watchfiles.Change.modified, str(kept))}, recent)
        os.utime(kept, ns=(8_000_000_000, 8_000_000_000))
        later = await trigger._events_for({(watchfiles.Change.modified, str(kept))}, recent)
    assert [e.payload for e in first] == [{"path": str(kept), "change": "modified"}]
    assert first[0].dedup_key == first_key
    assert first_key.endswith(f":7000000000:1:{kept}")
    assert again == []
    assert [e.dedup_key for e in later] == [file_dedup_key(str(kept), os.stat(kept))]


def test_file_dedup_key_is_the_same_for_a_relisting_and_new_for_a_replacement(
    tmp_path: Path,
) -> None:
    path, replacement = tmp_path / "data.csv", tmp_path / "data.csv.tmp"
    for file in (path, replacement):
        file.write_text("same")
        os.utime(file, ns=(9_000_000_000, 9_000_000_000))
    key = file_dedup_key(str(path), os.stat(path))
    assert file_dedup_key(str(path), os.stat(path)) == key  # seen again: one event
    os.replace(replacement, path)  # same path, size and mtime; another file
    assert file_dedup_key(str(path), os.stat(path)) != key


async def test_watch_trigger_fires_for_a_file_replaced_within_its_mtime(tmp_path: Path) -> None:
    trigger = DirectoryWatchTrigger(str(tmp_path), "*.csv")
    path, replacement = tmp_path / "data.csv", tmp_path / "data.part"
    for file in (path, replacement):
        file.write_text("same")
        os.utime(file, ns=(9_000_000_000, 9_000_000_000))
    recent = _RecentWrites(RECENT_WRITES_MAX)
    with anyio.fail_after(5):
        first = await trigger._events_for({(watchfiles.Change.added, str(path))}, recent)
        os.replace(replacement, path)
        replaced = await trigger._events_for({(watchfiles.Change.added, str(path))}, recent)
    assert [e.payload for e in first + replaced] == [{"path": str(path), "change": "added"}] * 2
    assert first[0].dedup_key != replaced[0].dedup_key


async def test_watch_trigger_stops_promptly_when_cancelled(tmp_path: Path) -> None:
    # watchfiles alone would hold the cancellation for up to its 5 s thread timeout.
    trigger = DirectoryWatchTrigger(str(tmp_path))
    with anyio.fail_after(2), anyio.move_on_after(0.2) as scope:
        await collect_events(trigger, 1, timeout=10)
    assert scope.cancelled_caught


async def test_watch_trigger_waits_quietly_for_a_missing_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="triggers")
    monkeypatch.setattr(watch_module, "MISSING_DIRECTORY_POLL_S", 0.01)
    checks = _count_calls(monkeypatch, watch_module, "_is_directory")
    directory = tmp_path / "missing"
    trigger = DirectoryWatchTrigger(str(directory), "*.csv", debounce_ms=20)
    with anyio.fail_after(20):
        async with aclosing(trigger.run()) as run:

            async def create_then_write() -> None:
                await wait_until(lambda: checks[0] >= 5)  # several checks, one warning
                directory.mkdir()
                await wait_until(lambda: len(_presence_records(caplog)) == 2)  # watching it
                for n in itertools.count():  # until the watch (set up meanwhile) sees one
                    (directory / "a.csv").write_text(str(n))
                    await anyio.sleep(0.1)

            async with anyio.create_task_group() as tg:
                tg.start_soon(create_then_write)
                event = await anext(run)
                tg.cancel_scope.cancel()
    assert event.payload["path"] == str(directory / "a.csv")
    assert _presence_records(caplog) == [
        ("WARNING", "watch_directory_missing"),
        ("INFO", "watch_directory_appeared"),
    ]


# --- triggers.testing ------------------------------------------------------------------------


class _Recorder(BaseTrigger):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.log: list[str] = []

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (classpath_of(self), {"mode": self.mode})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            if self.mode == "sleep":
                await anyio.sleep_forever()
            if self.mode == "fire":
                yield TriggerEvent(1)
                yield TriggerEvent(2)
        finally:
            self.log.append("run closed")

    async def cleanup(self) -> None:
        self.log.append("cleanup")


async def test_run_until_event_closes_run_then_cleans_up() -> None:
    trigger = _Recorder("fire")
    assert await run_trigger_until_event(trigger) == TriggerEvent(1)
    assert trigger.log == ["run closed", "cleanup"]


async def test_run_until_event_reports_a_run_without_events() -> None:
    trigger = _Recorder("return")
    with pytest.raises(TriggerContractError, match="0 of 1"):
        await run_trigger_until_event(trigger)
    assert trigger.log == ["run closed", "cleanup"]


async def test_run_until_event_times_out_and_still_cleans_up() -> None:
    trigger = _Recorder("sleep")
    with pytest.raises(TimeoutError):
        await run_trigger_until_event(trigger, timeout=0.05)
    assert trigger.log == ["run closed", "cleanup"]


async def test_manual_trigger_gets_payloads_fired_before_it_started() -> None:
    ManualTrigger.channel("m").fire({"n": 1}, dedup_key="one")
    event = await run_trigger_until_event(ManualTrigger("m"), timeout=1)
    assert event == TriggerEvent({"n": 1})
    assert event.dedup_key == "one"
    assert ManualTrigger.channel("m").subscriber_count == 0


async def test_manual_trigger_fires_every_running_instance() -> None:
    results: list[list[TriggerEvent]] = []

    async def run_one() -> None:
        results.append(await collect_events(ManualTrigger("m"), 2, timeout=2))

    channel = ManualTrigger.channel("m")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_one)
            tg.start_soon(run_one)
            await channel.wait_subscribed(2)
            channel.fire("x")
            channel.fire("y")
    assert results == [[TriggerEvent("x"), TriggerEvent("y")]] * 2
    assert ManualTrigger.channel("other").backlog == []


def test_manual_trigger_refuses_an_unstorable_payload() -> None:
    with pytest.raises(SerializationError):
        ManualTrigger.channel("m").fire(object())
    assert ManualTrigger.channel("m").backlog == []


@pytest.mark.parametrize("kind", ["FileDeleteTrigger", "DirectoryFileDeleteTrigger"])
async def test_a_trigger_stopped_while_it_takes_a_flag_file_fires_the_event_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # The triggerer stops a trigger with Task.cancel(). A stop that arrives just as the flag
    # file is deleted must not leave the file deleted and its event unfired: the event
    # reaches the consumer before the cancellation does.
    flag = tmp_path / "go.flag"
    flag.write_text("x")
    trigger: BaseEventTrigger = (
        FileDeleteTrigger(str(flag), poke_interval=0.01)
        if kind == "FileDeleteTrigger"
        else DirectoryFileDeleteTrigger(str(tmp_path), "go.flag", poke_interval=0.01)
    )
    loop = asyncio.get_running_loop()
    received: list[TriggerEvent] = []
    original = file_module._take_file

    def take_then_stop(path: str) -> os.stat_result | None:
        info = original(path)
        loop.call_soon_threadsafe(consumer.cancel)  # the stop arrives as the file goes
        return info

    async def consume() -> None:
        async with aclosing(trigger.run()) as events:
            async for event in events:  # each event counts as it arrives: the task is cancelled
                received.append(event)  # noqa: PERF401

    monkeypatch.setattr(file_module, "_take_file", take_then_stop)
    with anyio.fail_after(10):
        consumer = asyncio.ensure_future(consume())
        with pytest.raises(asyncio.CancelledError):
            await consumer
    assert not flag.exists()
    assert [e.payload["filepath"] for e in received] == [str(flag)]
