"""A process-independent digest of a ``shared_stream_key()``.

Within one process the manager groups subscribers by key equality. Across a fleet of
triggerers the key must be compared where no trigger object exists (a database column), so
it is reduced to a digest that equal keys share in every process: ``hash()`` is salted per
process and ``repr()`` of a set follows that salt, so neither will do. The key is encoded
canonically so that keys the manager finds equal encode alike (sets and dict items
sorted; numbers by value, as ``True == 1 == 1.0`` demands; enums by value, as a
``StrEnum`` member equals its string; paths as paths; dataclasses field by field), then
hashed with SHA-256.

A key holding any other kind of object has no digest (``UnstableKeyError``): its ``repr``
may carry a memory address or follow the per-process hash seed. Its triggers still share a
stream inside one triggerer, but the fleet cannot keep their group together.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import fractions
import hashlib
import math
import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Hashable

__all__ = ("UnstableKeyError", "broker_kind", "stream_key_digest")


class UnstableKeyError(TypeError):
    """The key holds a value whose text differs between processes."""


def stream_key_digest(key: Hashable) -> str:
    """The SHA-256 hex digest of ``key``'s canonical encoding (64 characters).

    Raises ``UnstableKeyError`` for a key that cannot be encoded the same way everywhere.
    """
    return hashlib.sha256(_canonical(key).encode("utf-8", "surrogatepass")).hexdigest()


def _canonical(value: object) -> str:
    """Equal values (as the manager compares keys: ``==`` and ``hash``) encode alike."""
    if isinstance(value, enum.Enum):
        value = value.value  # a StrEnum member equals its value; a plain Enum's value stands in
    if value is None or isinstance(value, str | bytes):
        return repr(str(value) if isinstance(value, str) else value)
    if isinstance(value, bool | int | float | fractions.Fraction | decimal.Decimal):
        return _number(value)
    if isinstance(value, tuple | list):  # a NamedTuple equals the plain tuple
        return "(" + ",".join(_canonical(item) for item in value) + ")"
    if isinstance(value, frozenset | set):
        return "{" + ",".join(sorted(_canonical(item) for item in value)) + "}"
    if isinstance(value, dict):
        items = sorted(f"{_canonical(k)}:{_canonical(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, pathlib.PurePath):
        return f"path:{value.as_posix()!r}"  # PurePosixPath('/x') == Path('/x')
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ",".join(
            f"{f.name}={_canonical(getattr(value, f.name))}"
            for f in dataclasses.fields(value)
            if f.compare
        )
        return f"{type(value).__module__}.{type(value).__qualname__}({fields})"
    raise UnstableKeyError(
        f"a {type(value).__qualname__} in a shared_stream_key() has no encoding that is the "
        "same in every process; use tuples of strings and numbers"
    )


def _number(value: bool | int | float | fractions.Fraction | decimal.Decimal) -> str:
    """Numbers that compare equal (``True == 1 == 1.0 == Decimal(1)``) encode alike."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, decimal.Decimal) and not value.is_finite():
        return repr(float(value)) if not value.is_nan() else "Decimal:NaN"
    if value == int(value):
        return str(int(value))
    as_float = float(value)
    return repr(as_float) if as_float == value else f"{type(value).__name__}:{value}"


def broker_kind(key: Hashable | None, trigger_cls: type) -> str:
    """What kind of upstream a group (or a trigger) reads, as reports name it: the first
    element of its ``shared_stream_key()`` when that is a string (``("kafka", ...)``,
    ``("sqs", ...)``, ``("directory-scan", ...)``), else the trigger class's name."""
    if isinstance(key, tuple) and key and isinstance(key[0], str) and key[0]:
        return key[0]
    return trigger_cls.__name__
