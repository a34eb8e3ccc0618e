"""The pure pieces of the RabbitMQ adapter: settlement plans, dedup keys, addresses, the
trigger's construction (no broker: ``tests/integration/test_rabbitmq.py`` has those)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.authoring.connections import Connection
from producers.exceptions import ProducerError
from producers.rabbitmq_core import (
    Disposition,
    RabbitMQMessage,
    Settle,
    Settlements,
    address_of,
    dedup_key,
    delivery_count,
    plain,
)
from producers.rabbitmq_trigger import RabbitMQMessageTrigger, url_from_connection

ACK, DEAD, REQUEUE = Disposition.ACK, Disposition.DEAD_LETTER, Disposition.REQUEUE


def _books(tags: int) -> Settlements:
    books = Settlements()
    for tag in range(1, tags + 1):
        books.arrived(tag, tag)
    while books.next_ready() is not None:
        pass
    return books


def test_acks_below_the_oldest_outstanding_fold_into_one_multiple_ack() -> None:
    books = _books(5)
    plan = books.plan([(1, ACK), (2, ACK), (3, ACK)])
    assert plan == [Settle("ack", 3, multiple=True)]
    assert len(books) == 2


def test_acks_above_an_outstanding_delivery_go_one_by_one() -> None:
    books = _books(4)
    assert books.plan([(2, ACK), (3, ACK)]) == [Settle("ack", 2), Settle("ack", 3)]
    assert books.plan([(1, ACK)]) == [Settle("ack", 1)]


def test_rejects_and_requeues_are_sent_before_a_multiple_ack_covering_them() -> None:
    books = _books(4)
    plan = books.plan([(1, ACK), (2, DEAD), (3, ACK), (4, REQUEUE)])
    assert plan == [Settle("reject", 2), Settle("nack", 4), Settle("ack", 3, multiple=True)]


def test_a_delivery_settled_twice_is_refused() -> None:
    books = _books(2)
    books.plan([(1, ACK)])
    with pytest.raises(ProducerError, match="not outstanding"):
        books.plan([(1, ACK)])


def test_deliveries_are_handed_over_in_tag_order_whatever_order_they_arrive_in() -> None:
    books = Settlements()
    books.arrived(2, "second")
    assert books.next_ready() is None
    books.arrived(1, "first")
    assert [books.next_ready(), books.next_ready(), books.next_ready()] == ["first", "second", None]


@settings(max_examples=60)
@given(st.lists(st.sampled_from([ACK, DEAD, REQUEUE]), min_size=1, max_size=30), st.data())
def test_a_multiple_ack_never_covers_an_outstanding_or_non_ack_delivery(
    dispositions: list[Disposition], data: st.DataObject
) -> None:
    books = _books(len(dispositions))
    tags = list(range(1, len(dispositions) + 1))
    settled = data.draw(st.lists(st.sampled_from(tags), unique=True))
    plan = books.plan([(tag, dispositions[tag - 1]) for tag in settled])
    to_ack = {tag for tag in settled if dispositions[tag - 1] is ACK}
    acked: set[int] = set()
    sent: set[int] = set()  # settled by an earlier operation of the plan
    for settle in plan:
        covered = {settle.delivery_tag}
        if settle.multiple:  # settles every tag up to it that is still unacked
            covered = {t for t in range(1, settle.delivery_tag + 1) if t not in sent}
            assert covered <= to_ack
        if settle.method == "ack":
            acked |= covered
        sent |= covered
    assert acked == to_ack


def test_dedup_keys_come_from_the_message_id_or_an_opted_in_digest() -> None:
    def message(message_id: str | None, body: bytes = b"{}") -> RabbitMQMessage:
        return RabbitMQMessage("q", message_id, {}, body, "q", "", {}, {}, False, None)

    assert dedup_key(message("m1"), "message_id") == "rabbitmq:q:m1"
    assert dedup_key(message("m1"), "payload") == "rabbitmq:q:m1"
    assert dedup_key(message(None), "message_id") is None
    first, same = (
        dedup_key(message(None, b"a"), "payload"),
        dedup_key(message(None, b"a"), "payload"),
    )
    assert first == same
    assert first != dedup_key(message(None, b"b"), "payload")


def test_quorum_delivery_counts_and_plain_header_values() -> None:
    assert delivery_count({"x-delivery-count": 2}) == 3
    assert delivery_count({}) is None
    assert plain({"a": b"x", "b": [b"y", 1]}) == {"a": "x", "b": ["y", 1]}


def test_an_address_never_shows_the_credentials() -> None:
    assert address_of("amqp://u:s3cr3t@broker:5673/orders") == "amqp://broker:5673 vhost 'orders'"
    assert address_of("amqps://u:p@broker/") == "amqps://broker:5671 vhost '/'"
    trigger = RabbitMQMessageTrigger(url="amqp://u:s3cr3t@broker/", queue="q")
    assert "s3cr3t" not in repr(trigger)
    assert "s3cr3t" not in str(trigger.shared_stream_key())


@pytest.mark.parametrize(
    ("uri", "url"),
    [
        ("amqp://guest:p%40ss@broker:5672/%2F", "amqp://guest:p%40ss@broker:5672/%2F"),
        ("amqp://guest:guest@broker/orders", "amqp://guest:guest@broker:5672/orders"),
        ("amqps://u:p@broker?heartbeat=30", "amqps://u:p@broker:5671/%2F?heartbeat=30"),
    ],
)
def test_a_connection_uri_becomes_the_trigger_url(uri: str, url: str) -> None:
    assert url_from_connection(Connection("c", uri=uri).to_dict()) == url


def test_siblings_share_a_key_by_connection_id_before_and_after_it_is_resolved() -> None:
    declared = RabbitMQMessageTrigger(conn_id="broker", queue="q", body_filter={"k": 1})
    resolved = RabbitMQMessageTrigger(conn_id="broker", url="amqp://x@h/", queue="q")
    assert declared.shared_stream_key() == resolved.shared_stream_key()
    classpath, kwargs = declared.serialize()
    assert classpath == "producers.rabbitmq_trigger.RabbitMQMessageTrigger"
    assert RabbitMQMessageTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_building_the_producer_imports_no_client_on_the_event_loop() -> None:
    probe = (
        "import sys\nfrom producers import RabbitMQMessageTrigger\n"
        "RabbitMQMessageTrigger(url='amqp://h/', queue='q').build_producer()\n"
        "print(' '.join(m for m in ('aio_pika', 'aiormq') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == []  # open_stream imports them in a worker thread


def test_constructing_the_trigger_imports_no_client_nor_async_runtime() -> None:
    modules = ("aio_pika", "aiormq", "pamqp", "anyio", "asyncio")
    probe = (
        "import sys\nfrom producers import RabbitMQMessageTrigger\n"
        "RabbitMQMessageTrigger(url='amqp://h/', queue='q', body_filter={'a': 1})\n"
        f"print(' '.join(m for m in {modules!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == []


def test_aiormq_lines_for_a_connection_it_raises_about_are_debug(caplog) -> None:
    from aiormq.exceptions import ConnectionClosed

    from producers.rabbitmq_errors import quiet_connect_errors

    quiet_connect_errors()
    client = logging.getLogger("aiormq.connection")
    caplog.set_level(logging.DEBUG, logger="aiormq.connection")
    client.error("error when creating transport: %r", OSError(111, "refused"))
    client.error('Unexpected connection close from remote "%s", ', "amqp://h")
    closed = ConnectionClosed(320, "CONNECTION_FORCED")
    client.warning("Cancelling cause reader exited abnormally", exc_info=closed)
    client.warning("Cancelling cause reader exited abnormally", exc_info=ValueError("frame"))
    assert [r.levelname for r in caplog.records] == ["DEBUG", "DEBUG", "DEBUG", "WARNING"]
