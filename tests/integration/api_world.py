"""A database with something of everything the REST API shows, made the real way: a DAG file
parsed by the DAG processor, runs created as ``sluice dags trigger`` creates them, states
set as ``sluice tasks set-state`` sets them, events emitted as ``sluice assets emit`` and
watchers record them, a triggerer job that claimed a watcher and published shared-stream
stats twice, a connection with a password, task logs where the executor writes them, and
users (admin, op, viewer) with API tokens.

Two secrets are planted: ``TRIGGER_SECRET`` in a watcher trigger's kwargs (stored
encrypted) and ``CONN_SECRET`` as a connection's password. No answer may hold either.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from engine.api import credentials
from engine.api.app import create_app
from engine.db.models import DagRun, TaskInstance, Trigger, utcnow
from engine.db.queries import actions, claims, mapping
from engine.db.queries import assets as assets_sql
from engine.db.queries import connections as connections_sql
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import runs as runs_sql
from engine.db.queries import streams as streams_sql
from engine.task_log_files import log_path
from engine.views import operations
from shared_stream import GroupStats
from tests.db_templates import migrated_copy
from tests.integration.api_support import ApiHarness
from tests.integration.harness import parsed_database
from triggers.serde import serialize_value

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sqlalchemy.orm import Session

TRIGGER_SECRET = "kwarg-secret-4f1c9a7e"
CONN_SECRET = "conn-password-8d2b6c31"
STREAM_KEY = "('dir', '/srv/inbox')"

DAG_FILE = """
from datetime import datetime

from engine import DAG, Asset, AssetWatcher, task
from triggers import FileDeleteTrigger

report = Asset("report")
inbox = Asset(
    "inbox",
    watchers=[AssetWatcher("inbox-flag", FileDeleteTrigger(filepath="/tmp/{secret}/flag"))],
)

with DAG("etl", schedule=None, start_date=datetime(2026, 1, 1), tags=["team-a"]):
    @task
    def extract():
        return 1

    @task(outlets=[report])
    def load(value):
        return value

    load(extract())

with DAG("consumer", schedule=(report | inbox), tags=["team-b"]):
    @task
    def use():
        return None

    use()

with DAG("hourly", schedule="@hourly", start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def tick():
        return None

    tick()

with DAG("fanout", schedule=None, start_date=datetime(2026, 1, 1)):
    @task
    def one(x):
        return x

    one.expand(x=[1, 2, 3])
"""


@dataclass
class World:
    api: ApiHarness
    tokens: dict[str, str]  # role -> token
    etl_run: str  # extract success (results, two logged tries), load failed
    etl_queued_run: str  # a second etl run, still queued
    fanout_run: str  # ``one`` expanded to map indexes 0..2
    consumer_run: str  # triggered by the watcher and CLI events
    triggerer_id: int
    watcher_trigger_id: int
    log_folder: Path

    def heartbeat(self) -> None:
        """Keep the triggerer job alive (its streams are shown only while it is)."""
        self.api.db.call(lambda s: jobs_sql.heartbeat(s, self.triggerer_id))

    def client(self, role: str = "admin") -> Any:
        client = self.api.client()
        client.headers["Authorization"] = f"Bearer {self.tokens[role]}"
        return client


def build_world(db_url: str, tmp_path: Path) -> World:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "world.py").write_text(textwrap.dedent(DAG_FILE).replace("{secret}", TRIGGER_SECRET))
    parsed = parsed_database(db_url, tmp_path, dags)
    api = ApiHarness(db=parsed.db, config=parsed.config, app=create_app(parsed.config, parsed.db))
    tokens = {}
    for role in (credentials.ADMIN, credentials.OPERATOR, credentials.VIEWER):
        api.user(f"{role}-user", role)
        tokens[role] = api.token(f"{role}-user")
    db, cipher = parsed.db, parsed.cipher
    now = utcnow()
    etl = db.call(lambda s: _etl_runs(s, now))
    fanout = db.call(lambda s: _fanout_run(s, now))
    consumer = db.call(lambda s: _events_and_consumer_run(s, now))
    triggerer, watcher_trigger = db.call(lambda s: _triggerer(s, now))
    db.call(
        lambda s: connections_sql.upsert_connection(
            s,
            cipher,
            "warehouse",
            {"conn_type": "postgres", "host": "db", "login": "etl", "password": CONN_SECRET},
        )
    )
    folder = parsed.config.logging.task_log_folder
    for attempt in (1, 2):
        path = log_path(folder, "etl", etl[0], "extract", attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"try {attempt} of extract\nrésumé ✓\n", encoding="utf-8")
    return World(api, tokens, etl[0], etl[1], fanout, consumer, triggerer, watcher_trigger, folder)


def _etl_runs(session: Session, now: datetime) -> tuple[str, str]:
    first = operations.trigger_dag(
        session, "etl", conf={"region": "eu"}, logical_date=now - timedelta(hours=1), now=now
    )["run_id"]
    second = operations.trigger_dag(session, "etl", conf=None, logical_date=now, now=now)
    for task_id, state in (("extract", "success"), ("load", "failed")):
        actions.set_task_state(session, "etl", first, task_id, state, now=now)
    result = {"return_value": serialize_value({"rows": 3, "at": datetime(2026, 1, 2, tzinfo=UTC)})}
    session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.task_id == "extract",
            TaskInstance.dag_run_id == _run_pk(session, "etl", first),
        )
        .values(xcoms=result, try_number=2, start_date=now - timedelta(seconds=30), end_date=now)
    )
    return first, second["run_id"]


def _run_pk(session: Session, dag_id: str, run_id: str) -> int:
    query = select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    return int(session.execute(query).scalar_one())


def _fanout_run(session: Session, now: datetime) -> str:
    run_id = str(
        operations.trigger_dag(session, "fanout", conf=None, logical_date=None, now=now)["run_id"]
    )
    mapping.expand_task(session, _run_pk(session, "fanout", run_id), "one", 3, now=now)
    return run_id


def _events_and_consumer_run(session: Session, now: datetime) -> str:
    emitted = assets_sql.emit_asset_event(
        session, "report", extra={"by": "hand"}, source=assets_sql.SOURCE_CLI, created_by="cli:me@h"
    )
    inbox_id, trigger_id = _inbox(session)
    watched = assets_sql.insert_asset_events(
        session,
        [
            {
                "asset_id": inbox_id,
                "payload": {"filename": "flag"},
                "dedup_key": "flag-1",
                "source": assets_sql.SOURCE_WATCHER,
                "source_watcher": "inbox-flag",
                "source_trigger_id": trigger_id,
                "timestamp": now,
            }
        ],
    )
    event_ids = [emitted, *(e for e, _ in watched)]
    pk = runs_sql.create_run(
        session, "consumer", run_type=runs_sql.ASSET_TRIGGERED, now=now, asset_event_ids=event_ids
    )
    assert pk is not None
    return runs_sql.run_id_of(session, pk)


def _inbox(session: Session) -> tuple[int, int]:
    from engine.db.models import Asset, AssetWatcher

    row = session.execute(
        select(Asset.id, AssetWatcher.trigger_id)
        .join(AssetWatcher, AssetWatcher.asset_id == Asset.id)
        .where(Asset.name == "inbox")
    ).one()
    return int(row[0]), int(row[1])


def _triggerer(session: Session, now: datetime) -> tuple[int, int]:
    job = jobs_sql.start_job(session, job_type=jobs_sql.TRIGGERER_JOB, capacity=100)
    _, trigger_id = _inbox(session)
    live = claims.Liveness(alive=frozenset({job}))
    claims.assign_rows(session, [trigger_id], triggerer_id=job, live=live)
    for step, advanced in ((0, 10), (1, 40)):
        stats = GroupStats(
            key=STREAM_KEY,
            mode="ack",
            subscribers=2,
            outstanding_by_lane={"p0": 3 - step, "p1": 1},
            oldest_unresolved_age_s=2.0,
            events_polled=50 + advanced,
            deliveries=100,
            advances=step + 1,
            advanced_events=advanced,
        )
        when = now - timedelta(seconds=10 * (1 - step))
        streams_sql.publish_stream_stats(session, triggerer_id=job, stats=[stats], now=when)
    assert session.get(Trigger, trigger_id) is not None
    return job, trigger_id


def world_database(request: Any, tmp_path_factory: Any, name: str) -> Iterator[str]:
    """A database URL at head for a module's world: SQLite in a temporary folder, or a new
    PostgreSQL database (dropped afterwards), as ``request.param`` says."""
    with migrated_copy(request, request.param, tmp_path_factory.mktemp(name)) as url:
        yield url
