"""The operations view of each broker, on SQLite and PostgreSQL: what a real group publishes
of the broker it reads and of what it dead-lettered (a real SQS queue on moto, through the
real triggerer), as ``sluice streams list`` (table and ``--json``), ``GET /api/v1/streams``
and the web UI's shared-streams page show it; and a watcher whose Kafka broker cannot be
reached, named with its address by "why" (the view, the REST answer, ``sluice dags why``).
"""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select

from engine.api import credentials
from engine.api.app import create_app
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher, Trigger
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import streams as streams_sql
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from engine.views import streams as streams_view
from engine.views.why import explain_dag
from producers import SqsMessageTrigger
from shared_stream import GroupStats
from tests.cli import invoke
from tests.integration.api_support import ApiHarness, api_harness, bearer
from tests.integration.harness import Parsed, parsed_database
from tests.services_sqs import create_queue, queue_counts, receive_all, send_messages
from tests.waiting import eventually

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.services_sqs import SqsEndpoint

pytestmark = pytest.mark.integration

THRESHOLD_S = 5.0


def _settings() -> TriggererSettings:
    return TriggererSettings(
        capacity=10,
        heartbeat_s=0.2,
        health_check_threshold_s=THRESHOLD_S,
        claim_idle_interval_s=0.05,
        shutdown_grace_s=5,
    )


def _cli_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    return {
        "SLUICE_HOME": str(tmp_path / "home"),
        "SLUICE__CORE__SQL_ALCHEMY_CONN": db_url,
    }


# --- a real group: its broker and what it dead-lettered -----------------------------------


def _seed_watcher(db: Database, cipher: KwargsCipher, trigger: SqsMessageTrigger) -> int:
    def seed(session: Any) -> int:
        asset_id = session.execute(
            insert(Asset).values(name="orders", uri="test://orders", extra={}).returning(Asset.id)
        ).scalar_one()
        classpath, kwargs = trigger.serialize()
        tid = trigger_rows.add_trigger_row(
            session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
        )
        session.execute(insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid))
        return int(tid)

    return db.call(seed)


def _groups(db: Database) -> list[dict[str, Any]]:
    now = models.utcnow()
    return db.call(lambda s: streams_view.snapshot_page(s, threshold_s=THRESHOLD_S, now=now)[0])


@pytest.mark.both_databases
async def test_a_real_group_publishes_its_broker_and_the_events_it_dead_lettered(
    sqs_endpoint: SqsEndpoint, sqs_queue_name: str, migrated_db_url: str, tmp_path: Path
) -> None:
    """Two of five messages are not JSON: the watcher rejects them, the producer sends them
    to the dead-letter queue; the snapshot says ``sqs`` and 2, and so does the CLI."""
    from aiobotocore.session import get_session

    db = Database(migrated_db_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    async with get_session().create_client("sqs", **sqs_endpoint.client_kwargs()) as sqs:
        dlq = await create_queue(sqs, f"{sqs_queue_name}-dlq")
        url = await create_queue(sqs, sqs_queue_name)
        trigger = SqsMessageTrigger(
            queue_url=url,
            endpoint_url=sqs_endpoint.url,
            region_name=sqs_endpoint.region_name,
            aws_access_key_id=sqs_endpoint.aws_access_key_id,
            aws_secret_access_key=sqs_endpoint.aws_secret_access_key,
            wait_time_s=1,
            body_filter={"kind": "order"},
            on_reject="dead_letter",
            dead_letter_queue_url=dlq,
        )
        _seed_watcher(db, cipher, trigger)
        triggerer = Triggerer(db=db, cipher=cipher, settings=_settings())
        env = _cli_env(migrated_db_url, tmp_path)
        try:
            with anyio.fail_after(40):
                async with anyio.create_task_group() as tg:
                    await tg.start(triggerer.run)
                    await send_messages(
                        sqs,
                        url,
                        [
                            {"MessageBody": json.dumps({"kind": "order", "n": 1})},
                            {"MessageBody": "not json"},
                            {"MessageBody": json.dumps({"kind": "refund", "n": 2})},
                            {"MessageBody": "{broken"},
                            {"MessageBody": json.dumps({"kind": "order", "n": 3})},
                        ],
                    )

                    async def published() -> dict[str, Any] | None:
                        rows = await anyio.to_thread.run_sync(_groups, db)
                        done = rows and rows[0]["advanced_events"] >= 5
                        return rows[0] if done and rows[0]["dead_lettered"] == 2 else None

                    group = await eventually(published, within=30)
                    table = invoke("streams", "list", env=env)
                    listed = invoke("streams", "list", "--json", env=env)
                    triggerer.shutdown()
            assert (group["broker"], group["mode"], group["rejects"]) == ("sqs", "ack", 2)
            assert group["lanes"] == 0 and group["outstanding_by_lane"] == {}
            assert sorted(m["Body"] for m in await receive_all(sqs, dlq)) == [
                "not json",
                "{broken",
            ]
            assert await queue_counts(sqs, url) == (0, 0)
        finally:
            db.dispose()
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0]
    for column in ("BROKER", "LANES", "OUTSTANDING", "OLDEST_UNRESOLVED_AGE_S", "DEAD_LETTERED"):
        assert column in header
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["broker"], row["dead_lettered"], row["rejects"]) == ("sqs", 2, 2)
    assert (row["lanes"], row["outstanding"], row["outstanding_by_lane"]) == (0, 0, {})
    assert row["key"].startswith("('sqs', ") and "oldest_unresolved_age_s" in row


# --- the same columns, as the REST API and the web UI show them ---------------------------


@pytest.fixture
def api(migrated_db_url: str, tmp_path: Path) -> Iterator[ApiHarness]:
    harness = api_harness(migrated_db_url, tmp_path)
    yield harness
    harness.db.dispose()


def _publish(db: Database) -> int:
    """A live triggerer with a RabbitMQ group (two lanes behind, 3 dead-lettered) and a
    group keyed without a broker kind."""
    stats = [
        GroupStats(
            key="('rabbitmq', '127.0.0.1:5672', 'orders')",
            broker="rabbitmq",
            mode="ack",
            subscribers=2,
            outstanding_by_lane={"'orders'": 4, "'orders.eu'": 1},
            oldest_unresolved_age_s=1.5,
            rejects=3,
            dead_lettered=3,
        ),
        GroupStats(key="'plain'", broker="PlainTrigger", mode="fast", subscribers=1),
    ]

    def seed(session: Any) -> int:
        job = jobs_sql.start_job(session, job_type=jobs_sql.TRIGGERER_JOB, capacity=5)
        streams_sql.publish_stream_stats(
            session, triggerer_id=job, stats=stats, now=models.utcnow()
        )
        return int(job)

    return db.call(seed)


def test_the_rest_api_and_the_streams_page_show_broker_lanes_and_dead_lettered(
    api: ApiHarness,
) -> None:
    _publish(api.db)
    api.user("vic", credentials.VIEWER)
    answer = api.client().get("/api/v1/streams?history=false", headers=bearer(api.token("vic")))
    assert answer.status_code == 200, answer.text
    by_broker = {g["broker"]: g for g in answer.json()["items"]}
    assert set(by_broker) == {"rabbitmq", "PlainTrigger"}
    rabbit = by_broker["rabbitmq"]
    assert (rabbit["lanes"], rabbit["outstanding"], rabbit["dead_lettered"]) == (2, 5, 3)
    assert rabbit["outstanding_by_lane"] == {"'orders'": 4, "'orders.eu'": 1}
    assert (by_broker["PlainTrigger"]["dead_lettered"], by_broker["PlainTrigger"]["lanes"]) == (
        0,
        0,
    )
    openapi = api.client().get("/api/v1/openapi.json", headers=bearer(api.token("vic")))
    schema = openapi.json()["components"]["schemas"]
    assert {"broker", "lanes", "dead_lettered"} <= set(schema["StreamGroup"]["properties"])

    client = api.client()
    api.login(client, "vic")
    page = client.get("/streams")
    assert page.status_code == 200, page.text
    html = page.text
    for header in ("<th>broker</th>", ">lanes</th>", ">outstanding</th>", ">dead-lettered</th>"):
        assert header in html
    row = html.split('data-broker="rabbitmq"', 1)[1].split("</tr>", 1)[0]
    assert '<td data-col="broker">rabbitmq</td>' in row
    assert '<td class="num" data-col="lanes">2</td>' in row
    assert '<td class="num" data-col="outstanding">5</td>' in row
    assert '<span class="error">3</span>' in row.split('data-col="dead_lettered"', 1)[1]


# --- a watcher that cannot reach its broker -------------------------------------------------


DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from producers import KafkaMessageTrigger

orders = Asset("orders", watchers=[AssetWatcher("orders-w", KafkaMessageTrigger(
    topics=["orders"], bootstrap_servers=SERVERS, group_id="sluice-why"))])


@task
def noop():
    return None


with DAG("on_orders", schedule=orders):
    noop()
"""


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def parsed(migrated_db_url: str, tmp_path: Path) -> Iterator[tuple[Parsed, str]]:
    servers = f"127.0.0.1:{_closed_port()}"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "orders.py").write_text(DAGS.replace("SERVERS", repr(servers)))
    found = parsed_database(migrated_db_url, tmp_path, dags)
    yield found, servers
    found.db.dispose()


def _why(parsed: Parsed) -> dict[str, Any]:
    now = models.utcnow()
    return parsed.db.call(
        lambda s: explain_dag(
            s,
            "on_orders",
            now=now,
            triggerer_threshold_s=THRESHOLD_S,
            scheduler_threshold_s=THRESHOLD_S,
        ),
        read_only=True,
    )


def _watcher(view: dict[str, Any]) -> dict[str, Any]:
    ((watcher,),) = (a["watchers"] for a in view["assets"])
    return dict(watcher)


@pytest.mark.both_databases
async def test_why_names_the_kafka_broker_a_watcher_cannot_reach_and_its_address(
    parsed: tuple[Parsed, str], migrated_db_url: str, tmp_path: Path
) -> None:
    found, servers = parsed
    triggerer = Triggerer(db=found.db, cipher=found.cipher, settings=_settings())
    expected = f"cannot reach its Kafka broker at {servers} ("

    async def failing() -> dict[str, Any] | None:
        view = await anyio.to_thread.run_sync(_why, found)
        return view if _watcher(view)["unreachable"] else None

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            view = await eventually(failing, within=20)
            text = invoke("dags", "why", "on_orders", env=_cli_env(migrated_db_url, tmp_path))
            triggerer.shutdown()
    watcher = _watcher(view)
    assert watcher["status"] == "failing" and watcher["owner"]["alive"] is True
    assert watcher["unreachable"] == {"broker": "kafka", "broker_name": "Kafka", "address": servers}
    assert watcher["problem"].startswith(expected)
    assert f"its watcher orders-w {expected}" in view["verdict"]
    assert view["findings"][0]["severity"] == "blocker"
    assert text.returncode == 0, text.stderr
    assert f"problem: {expected}" in text.stdout

    # A failure of another kind forgets the broker it could not reach.
    tid = watcher["trigger_id"]
    found.db.call(lambda s: trigger_rows.record_trigger_failure(s, tid, "ValueError('bad')"))
    row = found.db.call(lambda s: s.execute(select(Trigger).where(Trigger.id == tid)).scalar_one())
    assert (row.unreachable_broker, row.unreachable_address) == (None, None)


def test_the_rest_why_answer_carries_the_unreachable_broker(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "orders.py").write_text(DAGS.replace("SERVERS", repr("kafka.internal:9092")))
    found = parsed_database(migrated_db_url, tmp_path, dags)
    harness = ApiHarness(db=found.db, config=found.config, app=create_app(found.config, found.db))
    try:
        job = found.db.call(
            lambda s: jobs_sql.start_job(s, job_type=jobs_sql.TRIGGERER_JOB, capacity=5)
        )
        tid = found.db.call(lambda s: s.execute(select(Trigger.id)).scalar_one())

        def own_and_fail(session: Any) -> None:
            session.get(Trigger, tid).triggerer_id = job
            trigger_rows.record_trigger_failure(
                session,
                tid,
                "BrokerUnavailable: the Kafka broker is unreachable",
                unreachable_broker="kafka",
                unreachable_address="kafka.internal:9092",
            )

        found.db.call(own_and_fail)
        harness.user("vic", credentials.VIEWER)
        answer = harness.client().get(
            "/api/v1/dags/on_orders/why", headers=bearer(harness.token("vic"))
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        (watcher,) = body["assets"][0]["watchers"]
        assert watcher["unreachable"]["address"] == "kafka.internal:9092"
        assert (
            "its watcher orders-w cannot reach its Kafka broker at kafka.internal:9092"
            in (body["verdict"])
        )
    finally:
        found.db.dispose()
