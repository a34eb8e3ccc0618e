"""``triggering_asset_events`` read lazily by real task processes of the local executor: the
spec carries no events; a task that reads them gets its run's events over its request
channel, page by page in id order (``engine.executor.event_requests``), with the values and
types the eager context gave; a task that never reads them causes no request; templates and
callbacks (in the task's process, and in a fresh process after the task's crashed) see
them; an event too big for the channel fails the reading task with an error naming it."""

from __future__ import annotations

import inspect
import logging
import textwrap
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select, update

from engine.db import models
from engine.db.queries import assets as assets_sql
from engine.db.queries import run_context
from engine.db.queries import runs as runs_sql
from engine.execution.asset_events import AssetEvents
from engine.executor.event_requests import PAGE_MAX_BYTES
from engine.executor.task_logs import TaskLogNotFoundError, read_task_log
from engine.executor.task_specs import build_context
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually, wait_until
from triggers.serde import deserialize_value, dumps, loads, serialize_value

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

BIG = 3 * 1024 * 1024  # three such payloads do not fit one answer (8 MiB)
SMALL_EVENTS = 2_050  # over one page of EVENTS_PAGE_SIZE (2,000) after the big ones
READ_ACTION = "task_triggering_events_read"


def summary(events: Any) -> dict[str, list[list[Any]]]:
    """What the reading task returns of what it sees (its source is the DAG file's too)."""
    out: dict[str, list[list[Any]]] = {}
    for name in sorted(events):
        rows = out[name] = []
        for e in events[name]:
            payload = e.payload
            if isinstance(payload, str) and len(payload) > 1000:
                payload = ["big", len(payload)]
            rows.append(
                [
                    e.id,
                    e.asset.name,
                    e.asset.uri,
                    e.uri,
                    payload,
                    type(e.payload).__name__,
                    e.timestamp,
                    e.extra,
                    e.partition_key,
                    e.source,
                    e.source_watcher,
                ]
            )
    return out


DAG_FILE = f"""
import os
from typing import Any

from engine import DAG, Asset, BaseOperator, task

orders, prices = Asset("orders", uri="s3://bucket/orders"), Asset("prices")

{inspect.getsource(summary)}

@task
def reader(triggering_asset_events):
    events = triggering_asset_events
    assert events.get(orders) is events["orders"] is events[Asset("orders")]
    assert "orders" in events and prices in events and "other" not in events
    assert len(events) == 2 and sorted(events) == ["orders", "prices"]
    assert repr(events).startswith("{{'orders': [")
    return summary(events)


@task
def ignorer(triggering_asset_events):
    return type(triggering_asset_events).__name__


def said_in_callback(context):
    events = context["triggering_asset_events"]
    print("callback saw", sum(len(v) for v in events.values()), "events of", sorted(events))


@task(on_success_callback=said_in_callback)
def called_back():
    return None


@task(on_failure_callback=said_in_callback)
def crasher():
    os._exit(3)


class Render(BaseOperator):
    template_fields = ("text",)

    def __init__(self, *, text, **kwargs):
        super().__init__(**kwargs)
        self.text = text

    def execute(self, context):
        return self.text


with DAG("lazy", schedule=[orders, prices]):
    reader()
    ignorer()
    called_back()
    crasher()
    Render(
        task_id="render",
        text="{{{{ triggering_asset_events | length }}}} "
        "{{{{ triggering_asset_events['prices'] | length }}}} "
        "{{{{ triggering_asset_events['prices'][0].payload['i'] }}}} "
        "{{{{ triggering_asset_events['orders'][-1].uri }}}}",
    )
"""


class Env:
    def __init__(self, db: Database, cipher: KwargsCipher, settings: ExecutorSettings) -> None:
        self.db, self.cipher, self.settings = db, cipher, settings

    def emit(self, rows: list[tuple[str, Any, dict[str, Any] | None, str | None]]) -> list[int]:
        """Store events (asset, payload as stored, extra, partition key), as a watcher's
        persister or a task's outlet stores them; their ids, in order."""

        def insert(session: Any) -> list[int]:
            assets = dict(session.execute(select(models.Asset.name, models.Asset.id)).all())
            now = models.utcnow()
            values = [
                {
                    "asset_id": assets[name],
                    "payload": payload,
                    "extra": extra,
                    "dedup_key": None,
                    "source": "watcher" if extra is None else "task",
                    "source_watcher": "w" if extra is None else None,
                    "partition_key": key,
                    "timestamp": now + timedelta(microseconds=index),
                }
                for index, (name, payload, extra, key) in enumerate(rows)
            ]
            return [event_id for event_id, _ in assets_sql.insert_asset_events(session, values)]

        return self.db.call(insert)

    def new_run(self, event_ids: list[int]) -> tuple[int, str, dict[str, int]]:
        def create(session: Any) -> tuple[int, str, dict[str, int]]:
            pk = runs_sql.create_run(
                session,
                "lazy",
                run_type=runs_sql.ASSET_TRIGGERED,
                now=models.utcnow(),
                asset_event_ids=event_ids,
            )
            assert pk is not None
            state = runs_sql.load_run_state(session, pk)
            assert state is not None
            run = session.get(models.DagRun, pk)
            return pk, str(run.run_id), state.ti_ids

        return self.db.call(create)

    def eager(self, run_pk: int) -> AssetEvents:
        """The events as the spec carried them before: read at start, through the context's
        JSON, hydrated."""
        rows = self.db.call(lambda s: run_context.triggering_events(s, run_pk))
        context = build_context(
            dag_id="lazy",
            run_id="r",
            task_id="t",
            try_number=1,
            events=rows,
            default_deferrable=False,
        )
        raw = loads(dumps(context))
        assert isinstance(raw, dict)
        return AssetEvents.from_raw(raw["triggering_asset_events"])

    def schedule(self, *ti_ids: int) -> None:
        self.db.call(
            lambda s: s.execute(
                update(models.TaskInstance)
                .where(models.TaskInstance.id.in_(ti_ids))
                .values(state=TaskState.SCHEDULED)
            )
        )

    async def until_done(self, ti_id: int) -> models.TaskInstance:
        async def ended() -> models.TaskInstance | None:
            ti = await self.db.run(lambda s: s.get(models.TaskInstance, ti_id))
            done = (TaskState.SUCCESS, TaskState.FAILED)
            return ti if ti.state in done else None

        return await eventually(ended, within=60)

    def log(self, run_id: str, task_id: str) -> str:
        try:
            return read_task_log(self.settings.task_log_folder, "lazy", run_id, task_id, 1)
        except TaskLogNotFoundError:
            return ""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "lazy_dag.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, cipher, _ = parsed_database(migrated_db_url, tmp_path, dags)
    # the reading task's summary of 2,053 events is over the default 1 MiB result limit
    yield Env(db, cipher, fast_executor_settings(config, max_xcom_size_bytes=16 * 2**20))
    db.dispose()


def _small_payload(i: int) -> Any:
    if i % 7 == 3:  # stored by another program: not serde's JSON, handed over as it is
        return {"__sluice_type__": "unknown", "v": i}
    value = {"i": i, "at": datetime(2026, 1, 1, tzinfo=UTC), "raw": b"\x00\x01", "n": Decimal(i)}
    return serialize_value(value)


def _events(env: Env) -> list[int]:
    rows: list[tuple[str, Any, dict[str, Any] | None, str | None]] = [
        ("orders", serialize_value(str(n) * BIG), None, None) for n in range(3)
    ]
    for i in range(SMALL_EVENTS):
        name = "prices" if i % 2 else "orders"
        extra = {"from": "a task", "i": i} if i % 5 == 0 else None
        rows.append((name, _small_payload(i), extra, f"p{i % 3}" if i % 4 == 0 else None))
    return env.emit(rows)


def _reads(caplog: pytest.LogCaptureFixture, task_id: str) -> int:
    return sum(
        1
        for r in caplog.records
        if getattr(r, "action", None) == READ_ACTION and getattr(r, "task_id", None) == task_id
    )


@pytest.mark.both_databases
async def test_a_task_reads_every_event_in_pages_and_one_that_does_not_asks_nothing(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="engine.executor.event_requests")
    pk, run_id, tis = env.new_run(_events(env))
    env.schedule(tis["reader"], tis["ignorer"], tis["render"])
    with anyio.fail_after(120):
        async with running_executor(env.db, env.cipher, env.settings):
            reader = await env.until_done(tis["reader"])
            ignorer = await env.until_done(tis["ignorer"])
            render = await env.until_done(tis["render"])
    assert reader.state == TaskState.SUCCESS, env.log(run_id, "reader")
    got = deserialize_value(reader.xcoms["return_value"])
    assert got == loads(dumps(summary(env.eager(pk))))  # as the eager context gave them
    assert [row[0] for row in got["orders"]] == sorted(row[0] for row in got["orders"])
    assert len(got["orders"]) + len(got["prices"]) == 3 + SMALL_EVENTS
    assert {row[5] for row in got["orders"]} == {"str", "dict"}
    # 2 big events, then the third and 1,999 small (the page's row limit), then the rest
    assert _reads(caplog, "reader") == 3
    assert ignorer.state == TaskState.SUCCESS
    assert deserialize_value(ignorer.xcoms["return_value"]) == "LazyAssetEvents"
    assert _reads(caplog, "ignorer") == 0  # never read: never asked for
    assert render.state == TaskState.SUCCESS, env.log(run_id, "render")
    rendered = deserialize_value(render.xcoms["return_value"])
    assert rendered == f"2 {SMALL_EVENTS // 2} 1 s3://bucket/orders"


async def test_callbacks_see_the_events_in_the_task_process_and_in_a_fresh_one(
    env: Env,
) -> None:
    ids = env.emit([("orders", serialize_value(1), None, None), ("prices", None, {}, None)])
    _, run_id, tis = env.new_run(ids)
    env.schedule(tis["called_back"], tis["crasher"])
    said = "callback saw 2 events of ['orders', 'prices']"
    with anyio.fail_after(60):
        async with running_executor(env.db, env.cipher, env.settings):
            await wait_until(lambda: said in env.log(run_id, "called_back"), within=30)
            await wait_until(lambda: said in env.log(run_id, "crasher"), within=30)
    assert "running on_failure_callback in a fresh process" in env.log(run_id, "crasher")


async def test_an_event_too_big_for_the_channel_fails_the_reading_task_naming_it(
    env: Env,
) -> None:
    (event_id,) = env.emit([("orders", serialize_value("x" * PAGE_MAX_BYTES), None, None)])
    _, run_id, tis = env.new_run([event_id])
    env.schedule(tis["reader"], tis["ignorer"])
    with anyio.fail_after(60):
        async with running_executor(env.db, env.cipher, env.settings):
            reader = await env.until_done(tis["reader"])
            ignorer = await env.until_done(tis["ignorer"])
    assert reader.state == TaskState.FAILED
    log = env.log(run_id, "reader")
    assert "ChannelError: triggering_events request: asset event" in log
    assert f"asset event {event_id} of 'orders' is" in log
    assert "over the request channel's limit" in log
    assert ignorer.state == TaskState.SUCCESS  # the same run, its events never read
