"""JSON with tagged values: how trigger kwargs, event payloads and next_kwargs are stored.

Plain JSON types map to themselves. Every other supported type becomes a tagged object
``{"__sluice_type__": "<tag>", "v": <json>}``: aware datetimes, dates, times, timedeltas,
tuples, sets, frozensets, bytes, POSIX paths, decimals, UUIDs, non-finite floats, and dicts
whose keys are not all strings (or that use the reserved key themselves), stored as a list
of ``[key, value]`` pairs. Output is canonical: ``dumps`` sorts keys, and set members and
dict pairs are ordered by their own canonical text, so equal values give equal strings
(``payload_digest`` relies on it for deduplication keys).

Naive datetimes are refused: a stored instant must not depend on the clock of the process
that reads it back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeAlias
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from triggers.exceptions import SerializationError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"

TYPE_KEY: Final = "__sluice_type__"
VALUE_KEY: Final = "v"
MAX_DEPTH: Final = 100
_LABEL_MAX_CHARS: Final = 60
_NON_FINITE: Final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _canonical(data: JSONValue) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _label(key: object) -> str:
    text = repr(key)
    return text if len(text) <= _LABEL_MAX_CHARS else text[: _LABEL_MAX_CHARS - 3] + "..."


def _tag(tag: str, data: JSONValue) -> JSONValue:
    return {TYPE_KEY: tag, VALUE_KEY: data}


@dataclass(frozen=True, slots=True)
class _Site:
    """Where a value being serialized sits, for error messages."""

    where: str
    suffix: str = ""

    def fail(self, path: str, reason: str) -> NoReturn:
        raise SerializationError(f"cannot serialize {self.where}{path}{self.suffix}: {reason}")


# --- scalar encoders: value -> plain or tagged JSON --------------------------------------


def _check_offset(offset: timedelta) -> None:
    # ISO 8601 text cannot carry them faithfully (Python 3.11 parses them back as zero).
    if offset.microseconds:
        raise ValueError("UTC offsets with sub-second precision are not supported")


def _encode_datetime(value: datetime) -> JSONValue:
    offset = value.utcoffset()
    if offset is None:
        raise ValueError("naive datetime not allowed, use an aware one")
    _check_offset(offset)
    iso = value.isoformat()
    if isinstance(value.tzinfo, ZoneInfo) and value.tzinfo.key is not None:
        return _tag("datetime", [iso, value.tzinfo.key])
    return _tag("datetime", iso)


def _encode_time(value: time) -> JSONValue:
    offset = value.utcoffset()
    if value.tzinfo is not None and offset is None:
        raise ValueError(
            "time with a tzinfo that has no fixed offset; use a naive time or a UTC offset"
        )
    if offset is not None:
        _check_offset(offset)
    return _tag("time", value.isoformat())


def _encode_timedelta(value: timedelta) -> JSONValue:
    return _tag("timedelta", [value.days, value.seconds, value.microseconds])


def _encode_path(value: PurePosixPath) -> JSONValue:
    return _tag("path", str(value))


def _encode_bytes(value: bytes) -> JSONValue:
    return _tag("bytes", base64.b64encode(value).decode("ascii"))


def _encode_float(value: float) -> JSONValue:
    if math.isnan(value):
        return _tag("float", "nan")
    if math.isinf(value):
        return _tag("float", "inf" if value > 0 else "-inf")
    return float(value)


def _encode_date(value: date) -> JSONValue:
    return _tag("date", value.isoformat())


def _encode_decimal(value: Decimal) -> JSONValue:
    return _tag("decimal", str(value))


def _encode_uuid(value: UUID) -> JSONValue:
    return _tag("uuid", str(value))


# Checked in order with isinstance: datetime is a subclass of date.
_SCALAR_ENCODERS: Final[tuple[tuple[type[Any], Callable[[Any], JSONValue]], ...]] = (
    (float, _encode_float),
    (datetime, _encode_datetime),
    (date, _encode_date),
    (time, _encode_time),
    (timedelta, _encode_timedelta),
    (bytes, _encode_bytes),
    (PurePosixPath, _encode_path),
    (Decimal, _encode_decimal),
    (UUID, _encode_uuid),
)


class _Encoder:
    """One serialization pass: tracks depth and the containers on the current path."""

    def __init__(self, site: _Site) -> None:
        self._site = site
        self._active: set[int] = set()

    def encode(self, value: object, path: str = "", depth: int = 0) -> JSONValue:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, str):
            return str(value)
        for kind, encoder in _SCALAR_ENCODERS:
            if isinstance(value, kind):
                try:
                    return encoder(value)
                except ValueError as exc:
                    self._site.fail(path, str(exc))
        if isinstance(value, list | tuple | set | frozenset | dict):
            return self._encode_container(value, path, depth)
        self._site.fail(path, f"object of type {type(value).__name__} is not serializable")

    def _encode_container(
        self,
        value: list[object]
        | tuple[object, ...]
        | set[object]
        | frozenset[object]
        | dict[object, object],
        path: str,
        depth: int,
    ) -> JSONValue:
        if depth >= MAX_DEPTH:
            self._site.fail(path, f"nested deeper than {MAX_DEPTH} levels")
        if id(value) in self._active:
            self._site.fail(path, "the value contains a reference cycle")
        self._active.add(id(value))
        try:
            if isinstance(value, dict):
                return self._encode_dict(value, path, depth + 1)
            if isinstance(value, set | frozenset):
                return self._encode_set(value, path, depth + 1)
            items = [self.encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
            return _tag("tuple", items) if isinstance(value, tuple) else items
        finally:
            self._active.discard(id(value))

    def _encode_set(
        self, value: set[object] | frozenset[object], path: str, depth: int
    ) -> JSONValue:
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        items = [self.encode(item, f"{path}{{<{tag} member>}}", depth) for item in value]
        return _tag(tag, sorted(items, key=_canonical))

    def _encode_dict(self, value: dict[object, object], path: str, depth: int) -> JSONValue:
        if all(isinstance(key, str) for key in value) and TYPE_KEY not in value:
            return {
                str(key): self.encode(item, f"{path}[{key!r}]", depth)
                for key, item in value.items()
            }
        pairs: list[JSONValue] = [
            [
                self.encode(key, f"{path}[<key>]", depth),
                self.encode(item, f"{path}[{_label(key)}]", depth),
            ]
            for key, item in value.items()
        ]
        return _tag("dict", sorted(pairs, key=_canonical))


def _encode_top(value: object, site: _Site) -> JSONValue:
    try:
        return _Encoder(site).encode(value)
    except RecursionError:
        site.fail("", "nested too deeply")


# The exact types that are their own JSON form with no check of their value.
PLAIN_SCALARS: Final = frozenset({str, int, bool, type(None)})


def _is_plain_json(value: object, depth: int = 0) -> bool:
    """True when ``value`` is already its own JSON form: exact dicts (str keys, no type tag),
    lists, str, int, bool, None and finite floats, nested at most ``MAX_DEPTH`` deep.

    Exact types only (a subclass may serialize differently) and no error paths built: the
    common payload is checked at a fraction of the encoder's cost. A cycle ends as too deep.
    """
    kind = type(value)
    if kind is dict:  # the usual payload first
        if depth >= MAX_DEPTH or TYPE_KEY in value:  # type: ignore[operator]
            return False
        for key, item in value.items():  # type: ignore[attr-defined]
            # Scalars inline: a call per item is most of the cost of a flat payload.
            if type(key) is not str or (
                type(item) not in PLAIN_SCALARS and not _is_plain_json(item, depth + 1)
            ):
                return False
        return True
    if kind in PLAIN_SCALARS:
        return True
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    if kind is list:
        if depth >= MAX_DEPTH:
            return False
        for item in value:  # type: ignore[attr-defined]
            if type(item) not in PLAIN_SCALARS and not _is_plain_json(item, depth + 1):
                return False
        return True
    return False


# The check for callers on a hot path (``TriggerEvent``): True when ``value`` needs no
# encoding; when False, ``serialize_value`` says why (or encodes its tagged values).
is_plain_json: Final = _is_plain_json


def serialize_value(value: object, *, where: str = "value") -> JSONValue:
    """Turn ``value`` into plain JSON data; ``where`` names the value in error messages."""
    return _encode_top(value, _Site(where))


def _not_json(value: object) -> NoReturn:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One C encoder built once for every call: ``JSONEncoder.encode`` builds a new one (and a
# dict of the containers seen, for cycles) on each call, a third of the cost of a small
# payload. No cycle check: what it encodes is plain JSON data checked by
# ``_is_plain_json`` (a cycle is too deep there) or the fresh tree ``serialize_value``
# built. Compact separators, ASCII, no NaN / infinities: as
# ``JSONEncoder(separators=(",", ":"), allow_nan=False)``.
_c_encoder: Final = c_make_encoder(
    None, _not_json, encode_basestring_ascii, None, ":", ",", False, False, False
)


def _compact_encode(data: object) -> str:
    return "".join(_c_encoder(data, 0))


def json_text(value: object, *, where: str = "value", plain: bool = False) -> str:
    """Compact JSON text of ``serialize_value(value)``, keys in their own order: what a JSON
    column stores. Plain JSON data (the usual payload) goes straight to the C encoder, with
    no Python walk building a copy of it. ``plain``: the caller knows that ``value`` is
    plain JSON (``TriggerEvent.plain``: checked as the event was built), so it is not
    walked again.

    ASCII only, with the separators of ``dumps``: the text is as long as ``dumps(value)``
    (only the key order may differ), so a size limit measured on either is the same.
    """
    data = value if plain or _is_plain_json(value) else serialize_value(value, where=where)
    return _compact_encode(data)


# --- decoding -----------------------------------------------------------------------------


def _decode_datetime(data: JSONValue) -> datetime:
    if isinstance(data, list) and len(data) == 2:
        iso, key = _expect_str(data[0]), _expect_str(data[1])
        return datetime.fromisoformat(iso).astimezone(ZoneInfo(key))
    return datetime.fromisoformat(_expect_str(data))


def _decode_timedelta(data: JSONValue) -> timedelta:
    days, seconds, microseconds = _expect_list(data)
    if not all(type(part) is int for part in (days, seconds, microseconds)):
        raise ValueError("timedelta parts must be integers")
    return timedelta(days=days, seconds=seconds, microseconds=microseconds)  # type: ignore[arg-type]


def _decode_float(data: JSONValue) -> float:
    return _NON_FINITE[_expect_str(data)]


def _expect_str(data: JSONValue) -> str:
    if not isinstance(data, str):
        raise ValueError(f"expected a string, got {type(data).__name__}")
    return data


def _expect_list(data: JSONValue) -> list[JSONValue]:
    if not isinstance(data, list):
        raise ValueError(f"expected a list, got {type(data).__name__}")
    return data


_SCALAR_DECODERS: Final[dict[str, Callable[[JSONValue], object]]] = {
    "float": _decode_float,
    "datetime": _decode_datetime,
    "date": lambda data: date.fromisoformat(_expect_str(data)),
    "time": lambda data: time.fromisoformat(_expect_str(data)),
    "timedelta": _decode_timedelta,
    "bytes": lambda data: base64.b64decode(_expect_str(data), validate=True),
    "path": lambda data: Path(_expect_str(data)),
    "decimal": lambda data: Decimal(_expect_str(data)),
    "uuid": lambda data: UUID(_expect_str(data)),
}
_CONTAINER_TAGS: Final = frozenset({"tuple", "set", "frozenset", "dict"})
_DECODE_ERRORS: Final = (
    ValueError,
    TypeError,
    KeyError,
    InvalidOperation,
    binascii.Error,
    ZoneInfoNotFoundError,
    OverflowError,
)


class _Decoder:
    def decode(self, data: JSONValue, depth: int = 0) -> object:
        if isinstance(data, list):
            self._check_depth(depth)
            return [self.decode(item, depth + 1) for item in data]
        if isinstance(data, dict):
            self._check_depth(depth)
            if TYPE_KEY in data:
                return self._decode_tagged(data, depth + 1)
            return {key: self.decode(item, depth + 1) for key, item in data.items()}
        return data

    @staticmethod
    def _check_depth(depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise SerializationError(f"cannot deserialize: nested deeper than {MAX_DEPTH} levels")

    def _decode_tagged(self, data: dict[str, JSONValue], depth: int) -> object:
        tag = data[TYPE_KEY]
        if set(data) != {TYPE_KEY, VALUE_KEY} or not isinstance(tag, str):
            raise SerializationError(f"cannot deserialize: malformed tagged value {sorted(data)}")
        if tag not in _SCALAR_DECODERS and tag not in _CONTAINER_TAGS:
            raise SerializationError(f"cannot deserialize: unknown type tag {tag!r}")
        inner = data[VALUE_KEY]
        try:
            if tag in _SCALAR_DECODERS:
                return _SCALAR_DECODERS[tag](inner)
            return self._decode_container(tag, inner, depth)
        except SerializationError:
            raise
        except _DECODE_ERRORS as exc:
            raise SerializationError(f"cannot deserialize a {tag!r} value: {exc}") from exc

    def _decode_container(self, tag: str, inner: JSONValue, depth: int) -> object:
        items = [self.decode(item, depth) for item in _expect_list(inner)]
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(items)
        if tag == "frozenset":
            return frozenset(items)
        return dict(_pairs(items))


def _pairs(items: Iterable[object]) -> Iterable[tuple[object, object]]:
    for item in items:
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError("dict pairs must be [key, value] lists")
        yield item[0], item[1]


def deserialize_value(data: JSONValue) -> object:
    """Rebuild the value ``serialize_value`` turned into ``data``."""
    try:
        return _Decoder().decode(data)
    except RecursionError as exc:
        raise SerializationError("cannot deserialize: nested too deeply") from exc


# --- text ---------------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse(text: str) -> JSONValue:
    try:
        data: JSONValue = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise SerializationError(
            f"cannot deserialize: stored text is not valid JSON: {exc}"
        ) from exc
    return data


def dumps(value: object, *, where: str = "value") -> str:
    """Compact, canonical JSON text of ``value`` (equal values give equal strings)."""
    return _canonical(serialize_value(value, where=where))


def loads(text: str) -> object:
    """Rebuild the value ``dumps`` turned into ``text``."""
    return deserialize_value(_parse(text))


def dumps_kwargs(kwargs: Mapping[str, object], *, owner: str) -> str:
    """Canonical JSON text of a trigger's kwargs; errors name the kwarg and ``owner``."""
    encoded: dict[str, JSONValue] = {}
    for name, value in kwargs.items():
        if not isinstance(name, str):
            _Site("kwargs", f" of {owner}").fail("", f"kwarg names must be str, got {name!r}")
        encoded[name] = _encode_top(value, _Site(f"kwarg {name!r}", f" of {owner}"))
    if TYPE_KEY in encoded:
        pairs: list[JSONValue] = [[name, item] for name, item in encoded.items()]
        return _canonical(_tag("dict", sorted(pairs, key=_canonical)))
    return _canonical(encoded)


def loads_kwargs(text: str) -> dict[str, object]:
    """Rebuild the kwargs ``dumps_kwargs`` turned into ``text``."""
    value = loads(text)
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise SerializationError(
            "cannot deserialize kwargs: expected an object with string keys, "
            f"got {type(value).__name__}"
        )
    return value


def payload_digest(value: object) -> str:
    """SHA-256 hex digest of ``dumps(value)``: the dedup key of a ``dedup_by_payload`` trigger."""
    return hashlib.sha256(dumps(value, where="payload").encode("utf-8")).hexdigest()
