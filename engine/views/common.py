"""What every view shares: pages and their bounds, dates as ISO 8601 text, and values made
JSON-able."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Generic, TypedDict, TypeVar

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

T = TypeVar("T")

#: A page's size when none is asked for, and the largest one served.
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 500
#: The largest offset a page may start at: the databases' 64-bit signed integer (SQLite and
#: PostgreSQL bind an OFFSET as one; a larger Python int cannot be sent at all).
MAX_OFFSET: Final = 2**63 - 1
#: The largest value of an ``Integer`` column (PostgreSQL's 32-bit ``integer``): ids, map
#: indexes and try numbers; a filter on a larger one can match nothing, so it is refused.
MAX_INT32: Final = 2**31 - 1
#: The longest ``search`` text accepted (the UI's search box allows as many): a longer
#: LIKE pattern only makes the database work, and SQLite refuses very long ones.
MAX_SEARCH_LENGTH: Final = 250


class PageError(ValueError):
    """A page bound out of range (offset not in 0..MAX_OFFSET, limit not in 1..MAX_LIMIT)."""


def check_page(limit: int | None, offset: int) -> None:
    """Refuse a bad ``limit`` / ``offset`` (None: no limit, for the CLI's full lists)."""
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise PageError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    if not 0 <= offset <= MAX_OFFSET:
        raise PageError(f"offset must be between 0 and {MAX_OFFSET}, not {offset}")


class Page(TypedDict, Generic[T]):
    """One page of a list: its items, the total of the filtered list, and the bounds."""

    items: list[T]
    total: int
    limit: int | None
    offset: int


def page(items: Sequence[T], total: int, limit: int | None, offset: int) -> Page[T]:
    return {"items": list(items), "total": total, "limit": limit, "offset": offset}


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def duration_s(start: datetime | None, end: datetime | None, now: datetime) -> float | None:
    """Seconds from ``start`` to ``end`` (to ``now`` while not ended); None if not started."""
    if start is None:
        return None
    return round(max(((end or now) - start).total_seconds(), 0.0), 3)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: dict keys as text, tuples and sets as lists (sets in a
    stable order), dates as ISO text, bytes as UTF-8 text, NaN and infinities as text, and
    anything else as its ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return [jsonable(v) for v in sorted(value, key=repr)]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    return str(value)
