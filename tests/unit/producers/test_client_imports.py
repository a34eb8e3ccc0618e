"""A DAG file that declares a broker watcher imports no broker client: ``producers`` loads
its names on first use, and a trigger class imports its client only where the trigger runs
(its producer is built). Each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

CLIENTS = ("aiokafka", "aiobotocore", "botocore", "aiohttp")
# What only the triggerer's runtime needs: a task process importing its DAG file pays for
# none of it either.
ASYNC_RUNTIME = ("anyio", "asyncio")

_KAFKA = "KafkaMessageTrigger(topics='orders', group_id='g', bootstrap_servers='b:9092')"
_SQS = "SqsMessageTrigger(queue_url='http://127.0.0.1:1/123456789012/q')"


def _clients_after(code: str, modules: tuple[str, ...] = CLIENTS) -> list[str]:
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.split()


def test_importing_producers_and_its_trigger_classes_imports_no_client() -> None:
    code = (
        "import producers\n"
        "assert producers.KafkaMessageTrigger.__name__ == 'KafkaMessageTrigger'\n"
        "from producers import KafkaMessageTrigger, SqsMessageTrigger"
    )
    assert _clients_after(code) == []


def test_constructing_each_trigger_imports_no_client_nor_async_runtime() -> None:
    code = f"from producers import KafkaMessageTrigger, SqsMessageTrigger\n{_KAFKA}\n{_SQS}"
    assert _clients_after(code, CLIENTS + ASYNC_RUNTIME) == []


def test_building_a_producer_imports_its_client() -> None:
    code = (
        "from producers import KafkaMessageTrigger, SqsMessageTrigger\n"
        f"KafkaMessageTrigger.create_shared_stream_producer({_KAFKA}.serialize()[1])\n"
        f"{_SQS}.build_producer()"
    )
    assert set(_clients_after(code)) == set(CLIENTS)
