"""Partition mappers (Airflow 3.3's ``airflow.sdk`` partition mappers): which partition of a
DAG an upstream asset event's partition key stands for.

A ``PartitionedAssetTimetable`` gives every asset of its condition a mapper. The scheduler
passes each queued event's key to ``to_downstream``, which returns the downstream key (or
several: ``FanOutMapper``), or raises ``PartitionKeyError`` for a key the mapper refuses
(not in an ``AllowedKeyMapper``'s list, not readable as a date); the scheduler then drops
that event for that DAG and logs why. A rollup mapper (``is_rollup``) also says which
upstream keys make up a downstream key (``expected_upstream_keys``) and whether those that
arrived are enough to run (``is_satisfied``, its wait policy).

The mappers here: ``IdentityMapper``, ``AllowedKeyMapper``, ``FixedKeyMapper``,
``ProductMapper`` and ``ChainMapper``; the temporal ones (``StartOfHourMapper`` ...
``StartOfYearMapper``) are ``engine.authoring.partition_temporal``, ``RollupMapper`` and
``FanOutMapper`` (with a window) ``engine.authoring.partition_rollups``.
``serialize`` gives plain JSON and ``mapper_from_json`` rebuilds an equal mapper. Pure: no
clock, no I/O.
"""

from __future__ import annotations

import importlib
import itertools
import json
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

#: the longest partition key the metadata database stores (as Airflow)
MAX_PARTITION_KEY_LENGTH: Final = 250
_SHOWN_KEYS: Final = 10  # allowed keys named in an error message


class PartitionKeyError(ValueError):
    """A mapper refuses a partition key; the message says which key, which mapper, why."""


class PartitionMapper:
    """Maps the partition key of an upstream asset event to the key of the DAG run it
    belongs to. Subclasses set ``json_type`` and implement ``to_downstream``."""

    json_type: ClassVar[str] = ""
    is_rollup: ClassVar[bool] = False
    _readers: ClassVar[dict[str, Callable[[Mapping[str, Any]], PartitionMapper]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "json_type" in vars(cls) and is_engine_mapper(cls):  # not a subclass in a DAG file
            PartitionMapper._readers[cls.json_type] = cls._from_json

    def to_downstream(self, key: str) -> str | Iterable[str]:
        """The downstream key(s) of ``key``; PartitionKeyError if the mapper refuses it."""
        raise NotImplementedError

    def decode_downstream(self, key: str) -> Any:
        """A downstream key as a window reads it (see ``partition_windows``): the key."""
        return key

    def encode_upstream(self, decoded: Any) -> str:
        """A window member back as an upstream key: the member itself."""
        return str(decoded)

    def format_member(self, decoded: Any) -> str:
        """A window member as a *downstream* key, when this mapper is a FanOutMapper's
        ``downstream_mapper``: the member through ``to_downstream``."""
        mapped = self.to_downstream(str(decoded))
        if not isinstance(mapped, str):
            raise PartitionKeyError(f"{self!r} maps {decoded!r} to several keys {mapped!r}")
        return mapped

    def serialize(self) -> dict[str, Any]:
        """Plain JSON; ``mapper_from_json`` rebuilds an equal mapper."""
        return {"__type": self.json_type}

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        return cls()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionMapper):
            return NotImplemented
        return type(self) is type(other) and self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash(json.dumps(self.serialize(), sort_keys=True))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.serialize().items() if k != "__type")
        return f"{type(self).__name__}({args})"


def is_engine_mapper(kind: type) -> bool:
    """Whether ``kind`` is one of the mappers defined here (the only ones the scheduler can
    rebuild from the stored JSON), not a subclass defined in a DAG file."""
    return kind.__module__.startswith("engine.authoring.partition_")


def downstream_keys(mapper: PartitionMapper, key: str) -> tuple[str, ...]:
    """``mapper.to_downstream(key)`` as a tuple of distinct keys, each checked (a non-empty
    string of at most 250 characters); PartitionKeyError otherwise."""
    mapped = mapper.to_downstream(key)
    keys = (mapped,) if isinstance(mapped, str) else tuple(dict.fromkeys(mapped))
    for item in keys:
        if not isinstance(item, str) or not item:
            raise PartitionKeyError(f"{mapper!r} maps {key!r} to {item!r}, not a key")
        if len(item) > MAX_PARTITION_KEY_LENGTH:
            raise PartitionKeyError(
                f"{mapper!r} maps {key!r} to a key longer than {MAX_PARTITION_KEY_LENGTH} "
                f"characters: {item[:40]!r}..."
            )
    if not keys:
        raise PartitionKeyError(f"{mapper!r} maps {key!r} to no key")
    return keys


def check_mapper(value: object, name: str, *, where: str) -> PartitionMapper:
    """``value`` if it is one of the mappers defined here; DagDefinitionError otherwise."""
    if not isinstance(value, PartitionMapper):
        raise DagDefinitionError(
            f"{where}: {name} must be a partition mapper such as IdentityMapper() or "
            f"StartOfDayMapper(), got {value!r}"
        )
    if not is_engine_mapper(type(value)):
        raise DagDefinitionError(
            f"{where}: {name} {type(value).__name__} is a mapper class of the DAG file; the "
            "scheduler rebuilds mappers from their stored form, so only the mappers of "
            "engine.authoring (IdentityMapper, StartOfDayMapper, RollupMapper, ...) can be used"
        )
    return value


class IdentityMapper(PartitionMapper):
    """The downstream key is the upstream key (the default mapper)."""

    json_type = "identity"

    def to_downstream(self, key: str) -> str:
        return key


class AllowedKeyMapper(PartitionMapper):
    """Passes the keys of ``allowed_keys`` through unchanged and refuses every other key."""

    json_type = "allowed_key"

    def __init__(self, allowed_keys: Sequence[str]) -> None:
        where = caller_location()
        if isinstance(allowed_keys, str) or not isinstance(allowed_keys, list | tuple):
            raise DagDefinitionError(
                f"{where}: AllowedKeyMapper takes a list of keys, got {allowed_keys!r}"
            )
        if not allowed_keys or not all(isinstance(k, str) and k for k in allowed_keys):
            raise DagDefinitionError(
                f"{where}: AllowedKeyMapper needs a non-empty list of non-empty string keys, "
                f"got {allowed_keys!r}"
            )
        self.allowed_keys: list[str] = list(dict.fromkeys(allowed_keys))
        self._allowed = frozenset(self.allowed_keys)

    def to_downstream(self, key: str) -> str:
        if key not in self._allowed:
            shown = ", ".join(repr(k) for k in self.allowed_keys[:_SHOWN_KEYS])
            more = len(self.allowed_keys) - _SHOWN_KEYS
            suffix = f" and {more} more" if more > 0 else ""
            raise PartitionKeyError(
                f"partition key {key!r} is not an allowed key of AllowedKeyMapper "
                f"(allowed: {shown}{suffix})"
            )
        return key

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type, "allowed_keys": list(self.allowed_keys)}

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        return cls(data.get("allowed_keys"))  # type: ignore[arg-type]  # checked by __init__


class FixedKeyMapper(PartitionMapper):
    """Maps every upstream key to one ``downstream_key`` (e.g. a categorical rollup's
    bucket: ``RollupMapper(upstream_mapper=FixedKeyMapper("all"), window=SegmentWindow(...))``)."""

    json_type = "fixed_key"

    def __init__(self, downstream_key: str) -> None:
        where = caller_location()
        if not isinstance(downstream_key, str) or not downstream_key:
            raise DagDefinitionError(
                f"{where}: FixedKeyMapper needs a non-empty string key, got {downstream_key!r}"
            )
        if len(downstream_key) > MAX_PARTITION_KEY_LENGTH:
            raise DagDefinitionError(
                f"{where}: FixedKeyMapper key is longer than {MAX_PARTITION_KEY_LENGTH} characters"
            )
        self.downstream_key = downstream_key

    def to_downstream(self, key: str) -> str:
        return self.downstream_key

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type, "downstream_key": self.downstream_key}

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        return cls(data.get("downstream_key"))  # type: ignore[arg-type]  # checked by __init__


def _check_children(kind: str, mappers: Sequence[object], *, where: str) -> list[PartitionMapper]:
    children = [check_mapper(m, f"{kind} mapper {i}", where=where) for i, m in enumerate(mappers)]
    for child in children:
        if child.is_rollup:
            raise DagDefinitionError(
                f"{where}: {kind} cannot hold a rollup mapper ({child!r}); give the "
                "RollupMapper to the PartitionedAssetTimetable for the asset instead"
            )
    return children


def _children_json(mappers: Sequence[PartitionMapper]) -> list[dict[str, Any]]:
    return [mapper.serialize() for mapper in mappers]


def _children_from_json(data: Mapping[str, Any]) -> list[PartitionMapper]:
    items = data.get("mappers")
    if not isinstance(items, list):
        raise ValueError(f"stored mapper needs a list of mappers, got {data!r}")
    return [mapper_from_json(item) for item in items]


class ProductMapper(PartitionMapper):
    """A key of several segments joined by ``delimiter`` (``"us|2026-03-10T09:00:00"``): each
    segment goes through its own mapper and the results are joined again
    (``ProductMapper(IdentityMapper(), StartOfDayMapper())`` gives ``"us|2026-03-10"``). A
    segment mapper that gives several keys (a ``FanOutMapper``) gives every combination."""

    json_type = "product"

    def __init__(
        self,
        mapper0: PartitionMapper,
        mapper1: PartitionMapper,
        /,
        *mappers: PartitionMapper,
        delimiter: str = "|",
    ) -> None:
        where = caller_location()
        self.mappers = _check_children("ProductMapper", (mapper0, mapper1, *mappers), where=where)
        if not isinstance(delimiter, str) or not delimiter:
            raise DagDefinitionError(
                f"{where}: ProductMapper delimiter must be a non-empty string, got {delimiter!r}"
            )
        self.delimiter = delimiter

    def to_downstream(self, key: str) -> str | tuple[str, ...]:
        segments = key.split(self.delimiter)
        if len(segments) != len(self.mappers):
            raise PartitionKeyError(
                f"ProductMapper expects {len(self.mappers)} segments separated by "
                f"{self.delimiter!r} in partition key {key!r}, got {len(segments)}"
            )
        options = [
            downstream_keys(mapper, segment)
            for mapper, segment in zip(self.mappers, segments, strict=True)
        ]
        keys = tuple(self.delimiter.join(parts) for parts in itertools.product(*options))
        return keys[0] if len(keys) == 1 else keys

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "mappers": _children_json(self.mappers),
            "delimiter": self.delimiter,
        }

    def __repr__(self) -> str:
        mappers = ", ".join(repr(mapper) for mapper in self.mappers)
        return f"ProductMapper({mappers}, delimiter={self.delimiter!r})"

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        delimiter = data.get("delimiter")
        if not isinstance(delimiter, str):
            raise ValueError(f"stored ProductMapper needs a delimiter, got {data!r}")
        return cls(*_children_from_json(data), delimiter=delimiter)


class ChainMapper(PartitionMapper):
    """Applies mappers one after the other: ``ChainMapper(AllowedKeyMapper([...]),
    StartOfDayMapper())`` checks the key, then maps it to its day. A mapper that gives
    several keys passes each of them to the next."""

    json_type = "chain"

    def __init__(
        self, mapper0: PartitionMapper, mapper1: PartitionMapper, /, *mappers: PartitionMapper
    ) -> None:
        where = caller_location()
        self.mappers = _check_children("ChainMapper", (mapper0, mapper1, *mappers), where=where)

    def to_downstream(self, key: str) -> str | tuple[str, ...]:
        keys: tuple[str, ...] = (key,)
        for mapper in self.mappers:
            mapped = (downstream_keys(mapper, current) for current in keys)
            keys = tuple(dict.fromkeys(itertools.chain.from_iterable(mapped)))
        return keys[0] if len(keys) == 1 else keys

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type, "mappers": _children_json(self.mappers)}

    def __repr__(self) -> str:
        return f"ChainMapper({', '.join(repr(mapper) for mapper in self.mappers)})"

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> PartitionMapper:
        return cls(*_children_from_json(data))


def mapper_from_json(data: object) -> PartitionMapper:
    """Rebuild a mapper stored by ``PartitionMapper.serialize``; ValueError on bad data."""
    for module in ("partition_temporal", "partition_rollups"):  # they register their mappers
        importlib.import_module(f"engine.authoring.{module}")
    kind = data.get("__type") if isinstance(data, dict) else None
    reader = PartitionMapper._readers.get(kind) if isinstance(kind, str) else None
    if reader is None or not isinstance(data, dict):
        raise ValueError(f"unknown stored partition mapper {data!r}")
    return reader(data)
