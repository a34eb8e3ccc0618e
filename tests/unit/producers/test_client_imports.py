"""A DAG file that declares a broker watcher imports no broker client: ``producers`` loads
its names on first use, and a trigger class imports its client only where the trigger runs
(its producer is built or connects). Each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import producers

#: every broker client module an extra installs (``triggers.extras.EXTRA_OF``, Celery aside)
CLIENTS = (
    "aiokafka",
    "aiobotocore",
    "botocore",
    "aiohttp",
    "aio_pika",
    "aiormq",
    "redis",
    "nats",
    "paho",
)
# What only the triggerer's runtime needs (the event loop, TLS: ``ssl`` loads OpenSSL): a task
# process or a parse importing a DAG file pays for none of it either.
RUNTIME_ONLY = ("anyio", "asyncio", "ssl")
TRIGGER_CLASSES = tuple(name for name in producers.__all__ if name.endswith("Trigger"))
EXAMPLE_DAGS = sorted((Path(__file__).parents[3] / "dags").glob("example_*.py"))

#: one trigger of each broker, constructed as a DAG file would
CONSTRUCTED = {
    "kafka": "KafkaMessageTrigger(topics='orders', group_id='g', bootstrap_servers='b:9092')",
    "sqs": "SqsMessageTrigger(queue_url='http://127.0.0.1:1/123456789012/q')",
    "rabbitmq": "RabbitMQMessageTrigger(url='amqp://guest:guest@127.0.0.1:1/', queue='q')",
    "redis": "RedisStreamTrigger(url='redis://127.0.0.1:1/0', stream='s', group='g')",
    "nats": (
        "NatsJetStreamTrigger(servers='nats://127.0.0.1:1', stream='S', subjects='a.>', "
        "durable='d')"
    ),
    "mqtt": "MqttMessageTrigger(topic='a/#', host='127.0.0.1', port=1, client_id='c')",
}
#: what building each broker's producer imports (RabbitMQ and NATS: only when it connects)
CLIENTS_OF_PRODUCER = {
    "kafka": {"aiokafka"},
    "sqs": {"aiobotocore", "botocore", "aiohttp"},
    "rabbitmq": set(),
    "redis": {"redis"},
    "nats": set(),
    "mqtt": {"paho"},
}


def _loaded_after(code: str, modules: tuple[str, ...] = CLIENTS) -> list[str]:
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.split()


def test_importing_producers_and_its_trigger_classes_imports_no_client() -> None:
    assert len(TRIGGER_CLASSES) == 7  # the six brokers and MessageQueueTrigger
    code = (
        "import producers\n"
        "assert producers.KafkaMessageTrigger.__name__ == 'KafkaMessageTrigger'\n"
        f"from producers import {', '.join(TRIGGER_CLASSES)}"
    )
    assert _loaded_after(code) == []


def test_constructing_each_trigger_imports_no_client_nor_runtime_only_module() -> None:
    code = f"from producers import {', '.join(TRIGGER_CLASSES)}\n" + "\n".join(CONSTRUCTED.values())
    assert _loaded_after(code, CLIENTS + RUNTIME_ONLY) == []


@pytest.mark.parametrize("broker", sorted(CONSTRUCTED))
def test_building_a_producer_imports_its_client_and_no_other(broker: str) -> None:
    trigger = CONSTRUCTED[broker]
    code = (
        f"from producers import {trigger.partition('(')[0]}\n"
        f"trigger = {trigger}\n"
        "type(trigger).create_shared_stream_producer(trigger.serialize()[1])"
    )
    assert set(_loaded_after(code)) == CLIENTS_OF_PRODUCER[broker]


def test_importing_each_example_dag_file_imports_no_client_nor_asyncio_nor_ssl() -> None:
    """As a task process does (``import_dag_file``), one file after the other: each line
    names the file and what is loaded once it is imported."""
    assert len(EXAMPLE_DAGS) >= 12
    watched = (*CLIENTS, "asyncio", "ssl")
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engine.authoring.dag_files import import_dag_file\n"
        f"for path in {[str(path) for path in EXAMPLE_DAGS]!r}:\n"
        "    import_dag_file(Path(path))\n"
        f"    print(Path(path).name, *[m for m in {watched!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.splitlines() == [path.name for path in EXAMPLE_DAGS]
