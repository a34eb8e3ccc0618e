"""The pure pieces of the MQTT adapter (no broker): topic matching, bodies, dedup keys, and
a DAG file's import of ``MqttMessageTrigger`` importing no client."""

from __future__ import annotations

import subprocess
import sys

import pytest

from producers.mqtt_core import (
    NoIdentity,
    build_message,
    decode_body,
    dedup_key,
    default_client_id,
    topic_filter_problem,
    topic_matches,
)


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+/c", "a/x/c", True),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "a/b", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/+", "a/", True),
        ("a/b", "b/b", False),
    ],
)
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_filter_problem(topic_filter) is None
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("bad", ["", "a/#/b", "a/b#", "a+/b", 3])
def test_invalid_topic_filters_are_named(bad: object) -> None:
    assert topic_filter_problem(bad) is not None


def test_bodies_decode_as_json_then_text_then_base64() -> None:
    assert decode_body(b'{"a": 1}') == ({"a": 1}, True)
    assert decode_body(b"plain") == ("plain", False)
    assert decode_body(b"\xff\x00") == ({"base64": "/wA="}, False)


def _message(payload: bytes, topic: str = "s/1") -> object:
    return build_message(
        topic=topic,
        payload=payload,
        qos=1,
        retain=False,
        dup=False,
        mid=1,
        user_properties={},
        content_type=None,
    )


def test_dedup_keys() -> None:
    message = _message(b'{"id": "m-1", "nested": {"id": 7}}')
    assert dedup_key(message, "none", None) is None
    payload_key = dedup_key(message, "payload", None)
    assert payload_key is not None and payload_key.startswith("mqtt:payload:")
    assert dedup_key(_message(message.payload, topic="s/2"), "payload", None) != payload_key
    assert dedup_key(message, "none", "id") == "mqtt:id:m-1"
    assert dedup_key(message, "payload", "nested.id") == "mqtt:id:7"  # the field wins
    long_key = dedup_key(_message(b'{"id": "%s"}' % (b"x" * 300)), "none", "id")
    assert long_key is not None and long_key.startswith("mqtt:id-sha256:")
    for payload in (b'{"other": 1}', b"text", b'{"id": null}'):
        with pytest.raises(NoIdentity):
            dedup_key(_message(payload), "none", "id")


def test_default_client_id_is_stable_and_fits_mqtt_3_1_1() -> None:
    one = default_client_id("mqtt://h:1883", ("b/#", "a/#"))
    assert one == default_client_id("mqtt://h:1883", ("a/#", "b/#"))
    assert one != default_client_id("connection:x", ("a/#", "b/#"))
    assert len(one) <= 23


def test_declaring_an_mqtt_watcher_imports_neither_paho_nor_an_async_runtime() -> None:
    probe = (
        "import sys\n"
        "from producers import MqttMessageTrigger\n"
        "MqttMessageTrigger(topic='s/#', body_filter={'k': 1})\n"
        "print(' '.join(m for m in ('paho', 'anyio', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == []
