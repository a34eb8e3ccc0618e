"""A process-independent digest of a ``shared_stream_key()``.

Within one process the manager groups subscribers by key equality. Across a fleet of
triggerers the key must be compared where no trigger object exists (a database column), so
it is reduced to a digest that equal keys share in every process: ``hash()`` is salted per
process and ``repr()`` of a set follows that salt, so neither will do. The key is encoded
canonically (sets and dict items sorted, integral floats as integers as ``5 == 5.0``
demands, enums by value), then hashed with SHA-256.

A key that cannot be encoded canonically (an object without a ``__repr__`` of its own,
whose default repr carries a memory address) has no digest: its triggers still share a
stream inside one triggerer, but the fleet cannot keep its group together.
"""

from __future__ import annotations

import enum
import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Hashable

__all__ = ("UnstableKeyError", "stream_key_digest")


class UnstableKeyError(TypeError):
    """The key holds a value whose text differs between processes."""


def stream_key_digest(key: Hashable) -> str:
    """The SHA-256 hex digest of ``key``'s canonical encoding (64 characters).

    Raises ``UnstableKeyError`` for a key that cannot be encoded the same way everywhere.
    """
    return hashlib.sha256(_canonical(key).encode("utf-8", "surrogatepass")).hexdigest()


def _canonical(value: object) -> str:
    if value is None or isinstance(value, bool | str | bytes):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{_canonical(value.value)}"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, tuple | list):
        return "(" + ",".join(_canonical(item) for item in value) + ")"
    if isinstance(value, frozenset | set):
        return "{" + ",".join(sorted(_canonical(item) for item in value)) + "}"
    if isinstance(value, dict):
        items = sorted(f"{_canonical(k)}:{_canonical(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if type(value).__repr__ is object.__repr__:
        raise UnstableKeyError(
            f"a {type(value).__qualname__} in a shared_stream_key() has no __repr__ of its "
            "own: its text changes from process to process; use tuples of strings and numbers"
        )
    return f"{type(value).__qualname__}:{value!r}"
