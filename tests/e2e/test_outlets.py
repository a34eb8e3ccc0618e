"""Tasks that update assets, with ``sluice run`` as a subprocess: outlets across two DAG files,
``outlet_events`` extras, ``Metadata``, aliases, inlet events, retries that emit once, a task
ending from its trigger, and ``sluice assets emit``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.models import Asset, AssetEvent, DagRun, TaskInstance
from tests.cli import invoke
from tests.e2e.helpers import running_engine, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from engine.db.database import Database

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PRODUCER = """
from datetime import datetime, timedelta, timezone
from pathlib import Path

from engine import Asset, AssetAlias, Metadata, dag, task
from engine.exceptions import AirflowFailException, AirflowSkipException
from engine.sensors import DateTimeSensor

orders = Asset("orders", uri="s3://bucket/orders")
metrics = Asset("metrics")
FIRST_TRY_FAILS = Path({marker!r})


@dag(schedule=None)
def producer():
    @task(outlets=[orders])
    def write_orders(outlet_events):
        outlet_events[orders].extra = {{"rows": 3}}
        outlet_events[orders].extra["day"] = "2026-01-05"

    write_orders()


@dag(schedule=None)
def flaky_producer():
    @task(outlets=[orders], retries=2, retry_delay=timedelta(0))
    def write_once():
        if not FIRST_TRY_FAILS.exists():
            FIRST_TRY_FAILS.touch()
            raise RuntimeError("first try fails")

    write_once()


@dag(schedule=None)
def metadata_producer():
    @task(outlets=[metrics])
    def measure():
        yield Metadata(metrics, {{"count": 7}})

    measure()


@dag(schedule=None)
def alias_producer():
    @task(outlets=[AssetAlias("daily-files")])
    def attach(outlet_events):
        outlet_events[AssetAlias("daily-files")].add(
            Asset("file-2026-01-05", uri="file:///data/2026-01-05.csv"), extra={{"via": "alias"}}
        )

    attach()


@dag(schedule=None)
def trigger_ends_it():
    DateTimeSensor(
        task_id="wait",
        target_time=datetime.now(timezone.utc) + timedelta(seconds=1),
        start_from_trigger=True,
        end_from_trigger=True,
        outlets=[metrics],
    )


@dag(schedule=None)
def skipper():
    @task(outlets=[metrics])
    def maybe():
        raise AirflowSkipException("nothing to do today")

    @task
    def after():
        return 1

    maybe() >> after()


@dag(schedule=None)
def fails_now():
    @task(retries=3)
    def broken():
        raise AirflowFailException("bad input: retrying cannot help")

    broken()


producer()
skipper()
fails_now()
flaky_producer()
metadata_producer()
alias_producer()
trigger_ends_it()
"""

CONSUMER = """
from engine import DAG, Asset, AssetAlias, task

orders = Asset("orders", uri="s3://bucket/orders")
metrics = Asset("metrics")


@task(inlets=[orders])
def report(triggering_asset_events, inlet_events):
    seen = [
        {{
            "asset": e.asset.name,
            "extra": dict(e.extra),
            "source": e.source,
            "source_dag_id": e.source_dag_id,
            "source_task_id": e.source_task_id,
        }}
        for events in triggering_asset_events.values()
        for e in events
    ]
    return {{"seen": seen, "inlet_count": len(inlet_events[orders])}}


with DAG("on_orders", schedule=orders):
    report()

with DAG("on_metrics", schedule=metrics):
    report()

with DAG("on_alias", schedule=AssetAlias("daily-files")):
    report()


@task(inlets=[AssetAlias("daily-files")])
def read_alias(inlet_events):
    return [[e.asset.name, e.source_alias] for e in inlet_events[AssetAlias("daily-files")]]


with DAG("alias_reader", schedule=AssetAlias("daily-files")):
    read_alias()
"""

DAG_IDS = {
    "producer",
    "flaky_producer",
    "metadata_producer",
    "alias_producer",
    "trigger_ends_it",
    "skipper",
    "fails_now",
    "on_orders",
    "on_metrics",
    "on_alias",
    "alias_reader",
}


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("outlets")
    producers = PRODUCER.format(marker=str(root / "first-try-failed"))
    files = {"producers.py": producers, "consumers.py": CONSUMER.format()}
    with running_engine(root, files, DAG_IDS, template=sqlite_template) as running:
        yield running


def _results(db: Database, dag_id: str) -> list[Any]:
    """The results of the DAG's successful ``report`` tasks, oldest run first."""

    def read(session: Any) -> list[Any]:
        rows = session.execute(
            select(TaskInstance.xcoms)
            .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
            .where(DagRun.dag_id == dag_id, TaskInstance.state == "success")
            .order_by(DagRun.id)
        )
        return [
            json.loads(x["return_value"])
            if isinstance(x["return_value"], str)
            else x["return_value"]
            for x in rows.scalars()
        ]

    return db.call(read)


def _events(db: Database, asset: str) -> list[AssetEvent]:
    return db.call(
        lambda s: (
            s.execute(
                select(AssetEvent)
                .join(Asset, Asset.id == AssetEvent.asset_id)
                .where(Asset.name == asset)
                .order_by(AssetEvent.id)
            )
            .scalars()
            .all()
        )
    )


def _trigger(env: dict[str, str], dag_id: str) -> None:
    done = invoke("dags", "trigger", dag_id, env=env)
    assert done.returncode == 0, done.stderr


def _value(result: Any) -> Any:
    from triggers.serde import deserialize_value

    return deserialize_value(result)


def _wait_results(db: Database, dag_id: str, count: int) -> list[Any]:
    return wait_for(
        lambda: (r := _results(db, dag_id)) and len(r) >= count and r,
        timeout=90,
        what=f"{count} successful run(s) of {dag_id}",
    )


def test_outlet_of_one_file_runs_the_dag_of_another_with_extra_and_source(engine) -> None:
    db, env = engine["db"], engine["env"]
    _trigger(env, "producer")
    [result] = [_value(r) for r in _wait_results(db, "on_orders", 1)]
    assert result["seen"] == [
        {
            "asset": "orders",
            "extra": {"rows": 3, "day": "2026-01-05"},
            "source": "task",
            "source_dag_id": "producer",
            "source_task_id": "write_orders",
        }
    ]
    assert result["inlet_count"] >= 1
    [event] = [e for e in _events(db, "orders") if e.source_dag_id == "producer"]
    assert (event.source_dag_id, event.source_task_id, event.source_try_number) == (
        "producer",
        "write_orders",
        1,
    )


def test_a_task_that_fails_then_succeeds_emits_once(engine) -> None:
    db, env = engine["db"], engine["env"]
    before = len(_events(db, "orders"))
    runs_before = len(_results(db, "on_orders"))
    _trigger(env, "flaky_producer")
    _wait_results(db, "on_orders", runs_before + 1)
    events = [e for e in _events(db, "orders") if e.source_dag_id == "flaky_producer"]
    assert len(events) == 1 and events[0].source_try_number == 2
    assert len(_events(db, "orders")) == before + 1


def test_yielded_metadata_sets_the_extra(engine) -> None:
    db, env = engine["db"], engine["env"]
    _trigger(env, "metadata_producer")
    results = [_value(r) for r in _wait_results(db, "on_metrics", 1)]
    extras = [seen["extra"] for r in results for seen in r["seen"]]
    assert {"count": 7} in extras


def test_alias_attaches_an_event_and_runs_the_dag_scheduled_on_the_alias(engine) -> None:
    db, env = engine["db"], engine["env"]
    _trigger(env, "alias_producer")
    [result] = [_value(r) for r in _wait_results(db, "on_alias", 1)]
    assert result["seen"][0]["asset"] == "file-2026-01-05"
    assert result["seen"][0]["extra"] == {"via": "alias"}
    [event] = _events(db, "file-2026-01-05")
    assert event.source_alias == "daily-files"
    [read] = [_value(r) for r in _wait_results(db, "alias_reader", 1)]
    assert read == [["file-2026-01-05", "daily-files"]]  # inlet_events[alias]


def test_a_task_ended_by_its_trigger_updates_its_outlets(engine) -> None:
    db, env = engine["db"], engine["env"]
    before = len([e for e in _events(db, "metrics") if e.source_dag_id == "trigger_ends_it"])
    assert before == 0
    _trigger(env, "trigger_ends_it")
    wait_for(
        lambda: [e for e in _events(db, "metrics") if e.source_dag_id == "trigger_ends_it"],
        timeout=60,
        what="the end_from_trigger task's outlet event",
    )


def test_assets_emit_records_a_cli_event_that_schedules(engine) -> None:
    db, env = engine["db"], engine["env"]
    runs_before = len(_results(db, "on_orders"))
    done = invoke("assets", "emit", "orders", "--extra", '{"by": "hand"}', env=env)
    assert done.returncode == 0, done.stderr
    results = [_value(r) for r in _wait_results(db, "on_orders", runs_before + 1)]
    seen = results[-1]["seen"]
    assert [s["source"] for s in seen] == ["cli"] and seen[0]["extra"] == {"by": "hand"}
    event = _events(db, "orders")[-1]
    assert event.created_by is not None and event.created_by.startswith("cli:")
    unknown = invoke("assets", "emit", "no-such-asset", env=env)
    assert unknown.returncode != 0 and "no-such-asset" in unknown.stderr


def _task_instances(db: Database, dag_id: str) -> dict[str, TaskInstance]:
    return {
        ti.task_id: ti
        for ti in db.call(
            lambda s: (
                s.execute(select(TaskInstance).where(TaskInstance.dag_id == dag_id)).scalars().all()
            )
        )
    }


def test_skip_exception_skips_downstream_and_fail_exception_does_not_retry(engine) -> None:
    db, env = engine["db"], engine["env"]
    metrics_before = len(_events(db, "metrics"))
    _trigger(env, "skipper")
    _trigger(env, "fails_now")

    def ended(dag_id: str) -> list[DagRun]:
        return db.call(
            lambda s: (
                s.execute(
                    select(DagRun).where(DagRun.dag_id == dag_id, DagRun.end_date.is_not(None))
                )
                .scalars()
                .all()
            )
        )

    [skipped_run] = wait_for(lambda: ended("skipper"), timeout=60, what="skipper's run to end")
    [failed_run] = wait_for(lambda: ended("fails_now"), timeout=60, what="fails_now to end")
    skipper = _task_instances(db, "skipper")
    assert (skipper["maybe"].state, skipper["after"].state) == ("skipped", "skipped")
    assert skipped_run.state == "success"  # Airflow's leaf rule: skipped leaves succeed
    assert len(_events(db, "metrics")) == metrics_before  # a skipped task updates no outlet
    broken = _task_instances(db, "fails_now")["broken"]
    assert (broken.state, broken.try_number, broken.max_tries) == ("failed", 1, 3)
    assert failed_run.state == "failed"
