"""Decoding Kafka messages for triggers: values, keys, headers and event payloads.

Value formats: ``"auto"`` (JSON if it parses, else UTF-8 text, else base64), ``"json"`` and
``"text"`` (a value that does not decode is ``Undecodable``: the trigger rejects it), and
``"bytes"`` (always base64). Decoded forms are computed once per message and format and kept
in ``message.cache``, since every subscriber of a shared stream receives the same message.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from triggers.base import TriggerEvent
from triggers.serde import MAX_DEPTH, TYPE_KEY

if TYPE_CHECKING:
    from producers.kafka_messages import KafkaMessage

VALUE_FORMATS: Final = ("auto", "json", "text", "bytes")
_PAYLOAD_CACHE_PREFIX: Final = "payload:"
_PLAIN_CACHE_PREFIX: Final = "plain:"
_TYPE_KEY_BYTES: Final = TYPE_KEY.encode()
_DEEP_BYTES: Final = 2 * (MAX_DEPTH - 1)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A value that is not valid in the configured format, and why."""

    reason: str


Decoded: TypeAlias = "tuple[str, Any] | Undecodable"  # (value_encoding, value)


def _base64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def text_of(raw: bytes | None) -> str | None:
    """UTF-8 text of ``raw``, or None when absent or not UTF-8."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _readable(raw: bytes | None) -> str | dict[str, str] | None:
    """Text when UTF-8, else ``{"base64": ...}``; None stays None."""
    if raw is None:
        return None
    text = text_of(raw)
    return text if text is not None else {"base64": _base64(raw)}


def _not_plain_constant(name: str) -> Any:
    raise ValueError(f"{name} is not finite")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999
        raise ValueError(f"{text} is not finite")
    return number


# Any number that is not a finite float ends the fast path, so what it returns is plain.
_scan_once: Final = json.JSONDecoder(  # type: ignore[attr-defined]
    parse_constant=_not_plain_constant, parse_float=_finite_float
).scan_once


def _loads(raw: bytes) -> Any:
    """``json.loads(raw)`` (see ``_loads_plain``)."""
    return _loads_plain(raw)[0]


def _loads_plain(raw: bytes) -> tuple[Any, bool]:
    """``json.loads(raw)``, and whether the value is known to be plain JSON (its own stored
    form, ``serde.is_plain_json``), so an event's payload holding it need not be walked.

    The usual value goes through the C scanner alone: UTF-8 text that starts with the JSON
    value and ends with it (``json.loads`` of bytes first guesses the encoding, then goes
    through two Python-level wrappers). What the scanner returns is plain but for two
    things, judged on the bytes by C searches: a dict key spelling the reserved type key
    (written out or with escapes), and nesting past ``MAX_DEPTH`` inside an event's
    payload (fewer brackets than that cannot nest so deep). Anything else (another
    encoding, a BOM, surrounding white space, a number that is not finite, invalid JSON)
    takes ``json.loads``, which decodes it or raises exactly as before, and is not known
    to be plain.
    """
    try:
        text = raw.decode()
        value, end = _scan_once(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(raw), False
    if end != len(text):
        return json.loads(raw), False
    plain = (
        b"\\u" not in raw
        and _TYPE_KEY_BYTES not in raw
        # The payload holds the value one level down; nesting k deep takes 2k bytes.
        and (len(raw) < _DEEP_BYTES or raw.count(b"[") + raw.count(b"{") < MAX_DEPTH - 1)
    )
    return value, plain


def _decode(raw: bytes | None, value_format: str) -> tuple[Decoded, bool]:
    """The decoded value, and whether it is known to be plain JSON (a string is)."""
    if raw is None:
        return ("null", None), True
    if value_format == "bytes":
        return ("base64", _base64(raw)), True
    if value_format in ("auto", "json"):
        try:
            value, plain = _loads_plain(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            if value_format == "json":
                return Undecodable(f"value is not valid JSON ({exc})"), False
        else:
            return ("json", value), plain
    text = text_of(raw)
    if text is not None:
        return ("text", text), True
    if value_format == "text":
        return Undecodable("value is not valid UTF-8 text"), False
    return ("base64", _base64(raw)), True


def decoded_value(message: KafkaMessage, value_format: str) -> Decoded:
    """``(value_encoding, value)`` of the message in ``value_format``, or ``Undecodable``."""
    cache = message.cache
    decoded: Decoded | None = cache.get(value_format)
    if decoded is None:
        decoded, plain = _decode(message.value, value_format)
        cache[value_format] = decoded
        cache[_PLAIN_CACHE_PREFIX + value_format] = plain
    return decoded


def event_payload(message: KafkaMessage, value_format: str) -> dict[str, Any]:
    """The ``TriggerEvent`` payload of a decodable message (shared by its subscribers)."""
    cache_key = _PAYLOAD_CACHE_PREFIX + value_format
    payload: dict[str, Any] | None = message.cache.get(cache_key)
    if payload is None:
        decoded = decoded_value(message, value_format)
        if isinstance(decoded, Undecodable):
            raise ValueError(f"{message.coordinates}: {decoded.reason}")
        payload = message.cache[cache_key] = {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "timestamp": message.timestamp_ms,
            "key": _readable(message.key),
            "headers": [[name, _readable(value)] for name, value in message.headers],
            "value": decoded[1],
            "value_encoding": decoded[0],
        }
    return payload


def message_event(
    message: KafkaMessage, value_format: str, *, partition_key: str | None = None
) -> TriggerEvent:
    """The ``TriggerEvent`` of a decodable message, deduplicated by its coordinates, with
    the ``partition_key`` the watcher took from it. Its payload is not walked again when its
    value is known to be plain JSON: the other fields are strings and integers (a key or
    header that is not UTF-8 is ``{"base64": ...}``)."""
    payload = event_payload(message, value_format)
    key = f"kafka:{message.topic}:{message.partition}:{message.offset}"
    if message.cache[_PLAIN_CACHE_PREFIX + value_format]:
        return TriggerEvent.of_plain(payload, dedup_key=key, partition_key=partition_key)
    return TriggerEvent(payload, dedup_key=key, partition_key=partition_key)
