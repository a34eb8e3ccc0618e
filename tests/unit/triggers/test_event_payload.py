"""``TriggerEvent`` accepts exactly the payloads that can be stored, flat ones checked inline."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from triggers.base import TriggerEvent
from triggers.exceptions import SerializationError
from triggers.serde import TYPE_KEY, serialize_value


class Text(str):
    """A str subclass: not plain JSON by exact type, still storable."""


PAYLOADS: list[Any] = [
    {"topic": "orders", "partition": 3, "key": None, "ok": True},  # the inline path
    {},
    {"amount": 1.5},
    {"amount": math.nan},
    {"nested": {"a": [1, 2, {"b": "c"}]}},
    {1: "non-str key"},
    {Text("k"): "str subclass key"},
    {"v": Text("str subclass value")},
    {TYPE_KEY: "the reserved key"},
    {"at": datetime(2026, 1, 1, tzinfo=UTC)},
    {"t": (1, 2)},
    {"bad": object()},
    {"ok": 1, "deep": {"bad": [1, object()]}},
    {"naive": datetime(2026, 1, 1)},  # refused on purpose
    [1, {"a": object()}],
    "plain text",
    None,
]


def _storable(payload: Any) -> bool:
    try:
        serialize_value(payload)
    except SerializationError:
        return False
    return True


def _case_id(payload: Any) -> str:
    """``repr`` without object addresses: every xdist worker must collect the same ids."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(payload))


@pytest.mark.parametrize("payload", PAYLOADS, ids=_case_id)
def test_an_event_is_built_exactly_when_its_payload_can_be_stored(payload: Any) -> None:
    if _storable(payload):
        event = TriggerEvent(payload, dedup_key="k")
        assert event.payload is payload
        assert event.dedup_key == "k"
    else:
        with pytest.raises(SerializationError, match=r"^cannot serialize TriggerEvent payload"):
            TriggerEvent(payload, dedup_key="k")


def test_a_bad_value_in_a_flat_payload_is_named_with_its_key() -> None:
    with pytest.raises(SerializationError, match=r"TriggerEvent payload\['b'\]: object of type"):
        TriggerEvent({"a": 1, "b": object(), "c": "x"})
