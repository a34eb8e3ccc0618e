"""The pure pieces of the NATS JetStream adapter and its trigger (no server)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from producers import NatsJetStreamTrigger
from producers.exceptions import ProducerConfigError, ProducerError
from producers.nats_core import (
    Disposition,
    InFlight,
    InFlightMessages,
    NatsMessage,
    NatsReceipt,
    decode_body,
    disposition_of,
    subject_matches,
)
from shared_stream import AdvanceOutcome

CLEAN = AdvanceOutcome(acked=2, failed=0)
FAILED = AdvanceOutcome(acked=1, failed=1)
REJECTED = AdvanceOutcome(acked=1, failed=0, rejected=1)
NOBODY = AdvanceOutcome(acked=0, failed=0)


@pytest.mark.parametrize(
    ("outcome", "delivered", "dead_letter", "expected"),
    [
        (CLEAN, 5, True, Disposition.ACK),
        (REJECTED, 1, True, Disposition.DEAD_LETTER),
        (REJECTED, 1, False, Disposition.TERM),
        (FAILED, 1, True, Disposition.NAK),
        (FAILED, 5, True, Disposition.DEAD_LETTER),  # its last delivery: not silently dropped
        (FAILED, 5, False, Disposition.NAK),  # JetStream's MAX_DELIVERIES advisory
        (NOBODY, 4, True, Disposition.NAK),
        (NOBODY, 5, True, Disposition.DEAD_LETTER),
    ],
)
def test_dispositions(outcome, delivered, dead_letter, expected) -> None:
    got = disposition_of(outcome, num_delivered=delivered, max_deliver=5, dead_letter=dead_letter)
    assert got is expected


@pytest.mark.parametrize(
    ("delivered", "expected"), [(1, Disposition.NAK), (5, Disposition.DEAD_LETTER)]
)
def test_on_reject_nak_redelivers_a_rejected_message_until_its_last_delivery(
    delivered, expected
) -> None:
    got = disposition_of(
        REJECTED, num_delivered=delivered, max_deliver=5, dead_letter=True, on_reject="nak"
    )
    assert got is expected


def test_unlimited_deliveries_never_dead_letter_a_failure() -> None:
    assert disposition_of(FAILED, num_delivered=99, max_deliver=-1, dead_letter=True) is (
        Disposition.NAK
    )


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("orders.>", "orders.eu", True),
        ("orders.>", "orders.eu.paid", True),
        ("orders.>", "orders", False),
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders.eu.paid", False),
        ("orders.*.paid", "orders.us.paid", True),
        ("orders.eu", "orders.us", False),
        ("dead", "dead", True),
    ],
)
def test_subject_matches(pattern, subject, expected) -> None:
    assert subject_matches(pattern, subject) is expected


def test_bodies_decode_as_json_else_text() -> None:
    assert decode_body(b'{"n": 1}') == {"n": 1}
    assert decode_body(b"not json") == "not json"
    assert decode_body(b"\xff7") == "\ufffd7"


def test_in_flight_is_ordered_by_the_last_ack_wait_restart() -> None:
    in_flight = InFlightMessages()
    entries = [InFlight(NatsReceipt(f"r{n}", n, "s", 1), None, extended_at=n) for n in range(3)]
    for entry in entries:
        in_flight.add(entry)
    assert in_flight.next_due(10) == 10
    assert in_flight.due(11.5, 10) == entries[:2]
    in_flight.extended(entries[:2], 11.5)
    assert in_flight.next_due(10) == 12  # entry 2 is now the oldest
    assert in_flight.pop("r1") is entries[1]
    with pytest.raises(ProducerError, match="advanced twice"):
        in_flight.pop("r1")
    assert in_flight.drain() == [entries[2], entries[0]]
    assert len(in_flight) == 0


# -- the trigger ------------------------------------------------------------------------


def _message(body: Any = None, headers: dict[str, str] | None = None) -> NatsMessage:
    return NatsMessage("S", 7, "s.x", body, b"", headers or {}, 1, None)


async def test_filters() -> None:
    trigger = NatsJetStreamTrigger(
        stream="S",
        durable="d",
        body_filter={"order.kind": ["paid", "sent"], "urgent": True},
        header_filter={"region": "eu", "tier": 2},
    )
    headers = {"region": "eu", "tier": "2"}
    assert await trigger.matches(_message({"order": {"kind": "paid"}, "urgent": True}, headers))
    assert not await trigger.matches(_message({"order": {"kind": "paid"}, "urgent": 1}, headers))
    assert not await trigger.matches(_message({"order": {"kind": "paid"}, "urgent": True}))
    with pytest.raises(ProducerError, match="not a JSON object"):
        await trigger.matches(_message("text", headers))


def test_serialize_round_trips_and_siblings_share_a_key() -> None:
    trigger = NatsJetStreamTrigger(
        stream="S",
        durable="d",
        subjects="s.>",
        servers="nats://a:4222, nats://b:4222",
        dead_letter_subject="dead.s",
        body_filter={"k": 1},
        partition_key_header="region",
    )
    classpath, kwargs = trigger.serialize()
    again = NatsJetStreamTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    sibling = NatsJetStreamTrigger(
        stream="S", durable="d", servers=["nats://a:4222", "nats://b:4222"]
    )
    assert sibling.shared_stream_key() == trigger.shared_stream_key()
    by_id = NatsJetStreamTrigger(stream="S", durable="d", conn_id="nats_default")
    assert by_id.shared_stream_key() == ("nats", "connection:nats_default", "S", "d")


def test_connection_settings_from_the_uri_form_and_the_extra() -> None:
    from engine.authoring.connections import Connection

    uri = Connection.from_uri("n", "nats://alice:p%40ss@broker:4333").to_dict()
    assert NatsJetStreamTrigger.connection_settings("conn_id", {"conn_id": "n", **uri}) == {
        "servers": ["nats://broker:4333"],
        "user": "alice",
        "password": "p@ss",
    }
    extra = {"host": None, "extra": {"servers": "tls://a:1,tls://b:2", "token": "t"}}
    assert NatsJetStreamTrigger.connection_settings("conn_id", extra) == {
        "servers": ["tls://a:1", "tls://b:2"],
        "token": "t",
    }
    tls = {"host": "h", "port": 4222, "extra": {"tls": True}}
    assert NatsJetStreamTrigger.connection_settings("conn_id", tls)["servers"] == ["tls://h:4222"]
    with pytest.raises(ValueError, match="names no server"):
        NatsJetStreamTrigger.connection_settings("conn_id", {"conn_id": "n", "extra": {}})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stream": "a.b"}, "stream="),
        ({"durable": "has space"}, "durable="),
        ({"ack_wait_s": 0.5}, "ack_wait_s"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"deliver_policy": "sometimes"}, "deliver_policy"),
        ({"on_reject": "drop"}, "on_reject"),
        ({"dead_letter_subject": "dead.*"}, "literal subject"),
        ({"apply_function": "not a path"}, "apply_function"),
        ({"partition_key_field": "a", "partition_key_header": "b"}, "at most one"),
    ],
)
def test_settings_that_cannot_work(kwargs, match) -> None:
    full = {"stream": "S", "durable": "d", **kwargs}
    with pytest.raises(ProducerConfigError, match=match):
        NatsJetStreamTrigger(**full)


def test_declaring_the_trigger_imports_neither_nats_nor_an_async_runtime() -> None:
    probe = (
        "import sys\nfrom producers import NatsJetStreamTrigger\n"
        "NatsJetStreamTrigger(stream='S', durable='d')\n"
        "print(' '.join(m for m in ('nats', 'anyio', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == []


def test_nats_py_missing_where_the_trigger_runs_names_the_extra() -> None:
    """The client is imported when the producer connects (in a worker thread): its absence
    there is the same error as at the trigger's construction."""
    probe = textwrap.dedent(
        """
        import sys
        import anyio
        from producers import NatsJetStreamTrigger
        from triggers.exceptions import MissingExtraError
        producer = NatsJetStreamTrigger(stream="S", durable="d").build_producer()
        for name in [m for m in sys.modules if m == "nats" or m.startswith("nats.")]:
            del sys.modules[name]
        sys.modules["nats"] = None
        try:
            anyio.run(anext, aiter(producer.open_stream()))
        except MissingExtraError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert "needs the 'nats' package, which is not installed" in out.stdout
    assert "pip install 'sluice[nats]'" in out.stdout
