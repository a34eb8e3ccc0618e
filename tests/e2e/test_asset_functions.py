"""Assets as functions under ``sluice run`` on SQLite and PostgreSQL: a triggered ``@asset``
materialises its asset (one event, with its URI and extra), which runs an ``@asset`` that
reads it as an inlet and an ``@asset.multi`` that materialises two assets at once; a DAG
scheduled on the ``@asset.multi`` (all of its assets) runs once both are updated."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, Dag, DagRun, TaskInstance
from tests.cli import invoke
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DAGS = """
from engine import Asset, asset, dag, task


@asset(schedule=None, uri="s3://bucket/raw_orders", extra={"team": "sales"})
def raw_orders(self, context):
    return [self.name, self.uri, context["dag_run"].run_type]


@asset(schedule=raw_orders)
def order_count(self, raw_orders, context):
    return [self.name, [event.asset.uri for event in context["inlet_events"][raw_orders]]]


@asset.multi(schedule=raw_orders, outlets=[Asset("orders_eu"), Asset("orders_us")])
def split_orders(outlet_events):
    outlet_events[Asset("orders_eu")].extra = {"rows": 2}
    return "split"


@dag(schedule=split_orders)
def report():
    @task
    def summary(triggering_asset_events):
        return {name: len(events) for name, events in triggering_asset_events.items()}

    summary()


report()
"""

DAG_IDS = {"raw_orders", "order_count", "split_orders", "report"}


def _results(db: Database) -> dict[str, list[Any]]:
    """dag id -> what its successful runs' task returned, oldest first."""
    rows = db.call(
        lambda s: s.execute(
            select(DagRun.dag_id, TaskInstance.xcoms)
            .join(TaskInstance, TaskInstance.dag_run_id == DagRun.id)
            .where(DagRun.state == "success")
            .order_by(DagRun.id)
        ).all()
    )
    results: dict[str, list[Any]] = {}
    for dag_id, xcoms in rows:
        results.setdefault(dag_id, []).append(deserialize_value(xcoms["return_value"]))
    return results


def _events(db: Database) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """asset name -> (uri, extra) of each of its events."""
    rows = db.call(
        lambda s: s.execute(
            select(Asset.name, Asset.uri, AssetEvent.extra)
            .join(AssetEvent, AssetEvent.asset_id == Asset.id)
            .order_by(AssetEvent.id)
        ).all()
    )
    events: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, uri, extra in rows:
        events.setdefault(name, []).append((uri, extra or {}))
    return events


@pytest.mark.parametrize("migrated_db_url", ["sqlite", "postgres"], indirect=True)
def test_asset_functions_materialise_and_trigger_their_downstreams(
    migrated_db_url: str, tmp_path: Path
) -> None:
    home, dags = tmp_path / "home", tmp_path / "dags"
    for folder in (home, dags):
        folder.mkdir()
    (dags / "asset_functions.py").write_text(textwrap.dedent(DAGS))
    env = engine_env(home, url=migrated_db_url, dags=dags, parallelism=4)
    db = Database(migrated_db_url)
    engine = start_engine(env, tmp_path / "engine.log")
    try:
        wait_for(
            lambda: db.call(lambda s: set(s.execute(select(Dag.dag_id)).scalars())) >= DAG_IDS,
            timeout=60,
            what="the DAG file's four DAGs to be parsed",
        )
        triggered = invoke("dags", "trigger", "raw_orders", env=env)
        assert triggered.returncode == 0, triggered.stderr
        wait_for(
            lambda: set(_results(db)) == DAG_IDS,
            timeout=60,
            what="raw_orders, order_count, split_orders and report to succeed",
        )
    finally:
        code = stop(engine, timeout=60)
    assert code == 0
    assert _results(db) == {
        "raw_orders": [["raw_orders", "s3://bucket/raw_orders", "manual"]],
        "order_count": [["order_count", ["s3://bucket/raw_orders"]]],
        "split_orders": ["split"],
        "report": [{"orders_eu": 1, "orders_us": 1}],
    }
    assert _events(db) == {
        "raw_orders": [("s3://bucket/raw_orders", {})],
        "order_count": [("order_count", {})],
        "orders_eu": [("orders_eu", {"rows": 2})],
        "orders_us": [("orders_us", {})],
    }
    asset_extra = db.call(
        lambda s: s.execute(select(Asset.extra).where(Asset.name == "raw_orders")).scalar_one()
    )
    assert asset_extra == {"team": "sales"}
    runs = select(func.count()).select_from(DagRun)
    assert db.call(lambda s: s.execute(runs).scalar_one()) == 4  # each ran once
    db.dispose()
