"""Decoding Kafka messages for triggers: values, keys, headers and event payloads.

Value formats: ``"auto"`` (JSON if it parses, else UTF-8 text, else base64), ``"json"`` and
``"text"`` (a value that does not decode is ``Undecodable``: the trigger rejects it), and
``"bytes"`` (always base64). Decoded forms are computed once per message and format and kept
in ``message.cache``, since every subscriber of a shared stream receives the same message.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    from producers.kafka_client import KafkaMessage

VALUE_FORMATS: Final = ("auto", "json", "text", "bytes")
_PAYLOAD_CACHE_PREFIX: Final = "payload:"


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


_scan_once: Final = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(raw: bytes) -> Any:
    """``json.loads(raw)``, through the C scanner alone for the usual value: UTF-8 text
    that starts with the JSON value and ends with it (``json.loads`` of bytes first guesses
    the encoding, then goes through two Python-level wrappers). Anything else (another
    encoding, a BOM, surrounding white space, invalid JSON) takes ``json.loads``, which
    decodes it or raises exactly as before."""
    try:
        text = raw.decode()
        value, end = _scan_once(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(raw)
    return value if end == len(text) else json.loads(raw)


def _decode(raw: bytes | None, value_format: str) -> Decoded:
    if raw is None:
        return ("null", None)
    if value_format == "bytes":
        return ("base64", _base64(raw))
    if value_format in ("auto", "json"):
        try:
            return ("json", _loads(raw))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            if value_format == "json":
                return Undecodable(f"value is not valid JSON ({exc})")
    text = text_of(raw)
    if text is not None:
        return ("text", text)
    if value_format == "text":
        return Undecodable("value is not valid UTF-8 text")
    return ("base64", _base64(raw))


def decoded_value(message: KafkaMessage, value_format: str) -> Decoded:
    """``(value_encoding, value)`` of the message in ``value_format``, or ``Undecodable``."""
    cache = message.cache
    decoded: Decoded | None = cache.get(value_format)
    if decoded is None:
        decoded = cache[value_format] = _decode(message.value, value_format)
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
