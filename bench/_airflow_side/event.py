"""Airflow side of the event workload: a Kafka message sent -> the asset-triggered task running.

Run by bench/compare_airflow.py with the Airflow venv's python; one JSON line on stdout.

A whole Airflow on SQLite (a copy of the migrated template DB, log level INFO): api-server,
scheduler with its LocalExecutor, dag-processor and triggerer, as ``airflow standalone``
starts them. One DAG file: an asset with an ``AssetWatcher`` on the Kafka provider's
``KafkaMessageQueueTrigger`` (the ``MessageQueueTrigger`` of common-messaging for scheme
kafka, which runs ``AwaitMessageTrigger``; connection ``kafka_default`` to the broker the
driver started, group ``bench-airflow``, offsets from the earliest, session timeout 10 s and
heartbeat 3 s: Sluice's defaults), and a DAG scheduled on
it whose one task notes ``time.time()`` as its body starts. One warm-up message (until its
task has started), then ``--messages`` messages ``--interval`` s apart through
confluent-kafka (the provider's own client), each stamped just before it is sent; latency =
task body start - send. The same shape as bench/compare_airflow_user.py's ``event``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import common

DAG_FILE = '''\
"""Bench: one Kafka watcher asset; the task notes when its body starts."""

import time

from airflow.providers.apache.kafka.triggers.msg_queue import KafkaMessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task


@task
def started():
    now = time.time()
    with open({stamps!r}, "a") as f:
        f.write(f"{{now}}\\n")


trigger = KafkaMessageQueueTrigger(topics=[{topic!r}], apply_function="afbench_kafka.accept")
watched = Asset("bench_kafka", watchers=[AssetWatcher(name="w", trigger=trigger)])

with DAG("bench_event", schedule=[watched], catchup=False):
    started()
'''

ACCEPT = '''\
"""The trigger's apply_function: every message is an event (its value, decoded)."""


def accept(message):
    return message.value().decode()
'''


def _stamps(path: Path) -> list[float]:
    try:
        return [float(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _send(bootstrap: str, topic: str, payloads: list[bytes], gap_s: float) -> list[float]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False})
    sent = []
    for n, payload in enumerate(payloads):
        if n:
            time.sleep(gap_s)
        sent.append(time.time())
        producer.produce(topic, payload)
        producer.flush(10)
    return sent


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def run(
    template: Path, bootstrap: str, topic: str, messages: int, interval_s: float
) -> dict[str, float]:
    port = common.free_port()
    extra = common.stack_env(port, 8)
    home = common.prepare_home(template, "INFO", extra)
    os.environ.update(common.own_dags(home))
    stamps = home / "stamps.txt"
    (home / "dags").mkdir()
    (home / "dags" / "bench_event.py").write_text(DAG_FILE.format(stamps=str(stamps), topic=topic))
    plugin_dir = home / "bench_plugin"
    plugin_dir.mkdir()
    (plugin_dir / "afbench_kafka.py").write_text(ACCEPT)
    connection = {
        "conn_type": "kafka",
        "extra": {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-airflow",
            "auto.offset.reset": "earliest",
            # Sluice's KafkaMessageTrigger defaults, so both consumers join the group alike
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 3000,
        },
    }
    os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(connection)
    os.environ["PYTHONPATH"] = str(plugin_dir)
    db = home / "airflow.db"
    procs = [
        common.start(["api-server", "--port", str(port)], home, "api-server"),
        common.start(["scheduler"], home, "scheduler"),
        common.start(["dag-processor"], home, "dag-processor"),
        common.start(["triggerer"], home, "triggerer"),
    ]
    try:
        common.wait_for(lambda: common.api_healthy(port), 180, "the api-server", 0.2)
        watching = "SELECT count(*) FROM asset_watcher"
        common.wait_for(lambda: common.db_rows(db, watching) == [(1,)], 180, "the DAG parsed")
        _send(bootstrap, topic, [b'{"warm": 1}'], 0)
        common.wait_for(lambda: len(_stamps(stamps)) >= 1, 180, "the warm-up run's task")
        time.sleep(2.0)  # the warm-up run finishes; nothing else in flight
        payloads = [b'{"n": %d}' % n for n in range(messages)]
        sent = _send(bootstrap, topic, payloads, interval_s)
        common.wait_for(
            lambda: len(_stamps(stamps)) >= messages + 1, 120 + 10 * messages, "every run"
        )
        time.sleep(1.0)  # a run too many (an event counted twice) would show here
        got = _stamps(stamps)[1:]
    finally:
        for proc in reversed(procs):
            common.stop(proc)
    if len(got) != messages:
        raise RuntimeError(f"{len(got)} task starts for {messages} messages; logs in {home}")
    lat = [(start - send) * 1000 for start, send in zip(got, sent, strict=True)]
    common.remove_home(home)
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": _percentile(lat, 0.99),
        "max_ms": max(lat),
        "messages": messages,
        "interval_s": interval_s,
        "database": "sqlite",
        "log_level": "INFO",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    common.exit_on_signal()
    fig = run(args.template, args.bootstrap, args.topic, args.messages, args.interval)
    print(json.dumps({"system": "airflow", "workload": "event", **fig}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
