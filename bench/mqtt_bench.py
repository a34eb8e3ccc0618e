"""MQTT end-to-end throughput: watchers through the real triggerer vs a bare paho loop.

Run by hand (never in tests):  .venv/bin/python bench/mqtt_bench.py [--messages 2000]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

A Mosquitto of the bench's own is started on a free loopback port (``max_queued_messages 0``:
the machine's default of 1000 queued messages per offline session would drop a larger
preload). Each case makes a fresh persistent session (its own client id, subscribed to its
own topic at QoS 1), publishes M messages into it while it is offline, then drains it:

* bare: one paho client (MQTT 5, ``clean_start=False``, ``manual_ack=True``, Receive Maximum
  1000, the trigger's default), its network thread acking each message as it arrives, from
  the connect until M PUBACKs are queued: what the broker and the client allow.
* sluice N=1 / N=10: N ``MqttMessageTrigger`` watchers (no filter, ``max_in_flight=1000``)
  on the session, run by the real ``Triggerer`` in-process on SQLite (and PostgreSQL with
  ``--pg``), from the producer's connection (after a 0.5 s cohort grace, so all N watchers
  see every message) until all M x N asset events are committed and all M messages acked.

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import paho.mqtt.client as paho
from cryptography.fernet import Fernet
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from sqlalchemy import create_engine, insert, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import MqttMessageTrigger
from producers.mqtt_core import DEFAULT_MAX_IN_FLIGHT

# The broker launcher and clients are the test fixtures' own (tests/services_mqtt.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.services_mqtt import MqttBroker, PrivateMosquitto, open_session_sync, publish_sync

if TYPE_CHECKING:
    from engine.triggerer.persister import BatchResult

COHORT_GRACE_S = 0.5
MAX_IN_FLIGHT = DEFAULT_MAX_IN_FLIGHT  # the trigger's default: Receive Maximum of both sides
TIMEOUT_S = 300.0
#: every producer the triggerer built (``record_producers``), to read its ack count
BUILT: list[Any] = []


# -- the broker -------------------------------------------------------------------------


def preload(broker: MqttBroker, messages: int) -> tuple[str, str]:
    """A fresh offline session holding ``messages`` messages: (client id, topic filter)."""
    name = f"bench-{uuid.uuid4().hex[:12]}"
    client_id = f"bench-{uuid.uuid4().hex[:12]}"
    open_session_sync(broker, client_id, f"{name}/#")
    payloads = [json.dumps({"n": n}).encode() for n in range(messages)]
    for start in range(0, messages, 500):
        publish_sync(broker, f"{name}/x", payloads[start : start + 500])
    return client_id, f"{name}/#"


# -- the cases --------------------------------------------------------------------------


def bare_loop_sync(broker: MqttBroker, messages: int) -> dict[str, float]:
    client_id, _topic = preload(broker, messages)
    done = threading.Event()
    acked = 0

    def on_message(client: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        nonlocal acked
        client.ack(message.mid, message.qos)
        acked += 1
        if acked >= messages:
            done.set()

    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5,
        reconnect_on_failure=False,
        manual_ack=True,
    )
    client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 60
    properties.ReceiveMaximum = MAX_IN_FLIGHT
    started = time.perf_counter()
    client.connect(broker.host, broker.port, clean_start=False, properties=properties)
    client.loop_start()
    try:
        if not done.wait(TIMEOUT_S):
            raise SystemExit(f"the bare loop acked {acked} of {messages}")
        seconds = time.perf_counter() - started
    finally:
        client.disconnect()
        client.loop_stop()
    return {"watchers": 0, "seconds": seconds, "msgs_per_s": messages / seconds}


class _ConnectedAt(logging.Handler):
    """Records when the MQTT producer connected (the broker starts sending right away)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "mqtt.connected" and self.at is None:
            self.at = time.perf_counter()


def record_producers() -> None:
    """Keep every producer the triggerer builds in ``BUILT`` (to read its ack count)."""
    create = MqttMessageTrigger.create_shared_stream_producer.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, kwargs: dict[str, Any]) -> Any:
        producer = create(cls, kwargs)
        BUILT.append(producer)
        return producer

    MqttMessageTrigger.create_shared_stream_producer = classmethod(recording)  # type: ignore[method-assign,assignment]


def seed(
    db: Database, cipher: KwargsCipher, broker: MqttBroker, session: tuple[str, str], n: int
) -> None:
    client_id, topic = session

    def insert_rows(db_session: Any) -> None:
        for i in range(n):
            asset_id = db_session.execute(
                insert(Asset)
                .values(name=f"a{i}", uri=f"bench://a{i}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            trigger = MqttMessageTrigger(
                topic=topic,
                host=broker.host,
                port=broker.port,
                client_id=client_id,
                max_in_flight=MAX_IN_FLIGHT,
            )
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                db_session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            db_session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(insert_rows)


async def through_triggerer(
    broker: MqttBroker, db_url: str, messages: int, watchers: int
) -> dict[str, float]:
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    connected = _ConnectedAt()
    logging.getLogger("producers.mqtt").addHandler(connected)
    logging.getLogger("producers.mqtt").setLevel(logging.INFO)
    expected = messages * watchers
    committed = 0
    all_committed = anyio.Event()

    def on_committed(result: BatchResult) -> None:
        nonlocal committed
        committed += result.asset_events
        if committed >= expected:
            all_committed.set()

    try:
        session = await anyio.to_thread.run_sync(preload, broker, messages)
        seed(db, cipher, broker, session, watchers)
        settings = TriggererSettings(
            capacity=100,
            heartbeat_s=5,
            claim_idle_interval_s=0.05,
            cohort_grace_period_s=COHORT_GRACE_S,
        )
        triggerer = Triggerer(db=db, cipher=cipher, settings=settings, on_committed=on_committed)
        with anyio.fail_after(TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                await tg.start(triggerer.run)
                await all_committed.wait()
                while True:  # the last acks follow the last commit within milliseconds
                    if BUILT[-1].acked >= messages:
                        break
                    await anyio.sleep(0.005)
                finished = time.perf_counter()
                triggerer.shutdown()
        assert committed == expected, f"{committed} asset events, expected {expected}"
        assert connected.at is not None
        seconds = finished - connected.at
        return {
            "watchers": watchers,
            "seconds": seconds,
            "msgs_per_s": messages / seconds,
            "events_per_s": expected / seconds,
        }
    finally:
        logging.getLogger("producers.mqtt").removeHandler(connected)
        db.dispose()


def pg_database(admin_url: str) -> tuple[str, Any]:
    name = f"mqtt_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"{admin_url.rsplit('/', 1)[0]}/{name}", drop


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


async def _case(
    broker: MqttBroker, messages: int, backend: str, watchers: int, pg: str | None
) -> Any:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            return await through_triggerer(broker, f"sqlite:///{tmp}/q.db", messages, watchers)
    assert pg is not None
    db_url, drop = pg_database(pg)
    try:
        return await through_triggerer(broker, db_url, messages, watchers)
    finally:
        drop()


async def run_all(
    broker: MqttBroker, messages: int, pg: str | None, repeat: int
) -> dict[str, dict[str, Any]]:
    """Each case alternates with the bare loop ``repeat`` times (same load for both)."""
    backends = ["sqlite"] + (["postgres"] if pg else [])
    record_producers()
    results: dict[str, dict[str, Any]] = {}
    for backend in backends:
        for watchers in (1, 10):
            bare, ours, events = [], [], []
            for _ in range(repeat):
                figure = await anyio.to_thread.run_sync(bare_loop_sync, broker, messages)
                bare.append(figure["msgs_per_s"])
                fig = await _case(broker, messages, backend, watchers, pg)
                ours.append(fig["msgs_per_s"])
                events.append(fig["events_per_s"])
            results[f"{backend}_n{watchers}"] = {
                "watchers": watchers,
                "msgs_per_s": _spread(ours),
                "events_per_s": _spread(events),
                "bare_msgs_per_s": _spread(bare),
                "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per case")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a db per case)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (>= 3)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (min/median/max of >= 3 runs)")
    mosquitto = PrivateMosquitto(extra=["max_queued_messages 0", "autosave_interval 0"])
    mosquitto.start()
    load = os.getloadavg()
    try:
        results = anyio.run(run_all, mosquitto.broker, args.messages, args.pg, args.repeat)
    finally:
        mosquitto.close()
    print(f"{args.messages} messages per case, Mosquitto on port {mosquitto.port}, x{args.repeat}")
    for name, fig in results.items():
        ours, bare, events = fig["msgs_per_s"], fig["bare_msgs_per_s"], fig["events_per_s"]
        print(
            f"{name:12s} {ours['median']:8.0f} msgs/s [{ours['min']:.0f}..{ours['max']:.0f}]  "
            f"{events['median']:8.0f} asset events/s   bare loop {bare['median']:.0f} "
            f"[{bare['min']:.0f}..{bare['max']:.0f}]  ratio {fig['ratio_of_medians']:.2f}"
        )
    out = Path(__file__).parent / "results" / "mqtt.json"
    machine = {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load]}
    document = {"messages": args.messages, "repetitions": args.repeat, "machine": machine}
    out.write_text(json.dumps({**document, **results}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
