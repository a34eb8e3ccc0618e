"""What the resource routers share: the page parameters and the page model, reading through
the read model (``engine.views``) and acting through ``engine.db`` off the event loop,
and the errors those raise as HTTP answers.

- an unknown DAG, run, task, asset or log: 404;
- an action that does not apply to the current state (a run already ended, a run that
  exists for that logical date): 409;
- any other refused action or bad value: 422.

Every parameter is bounded to what the database can hold (``Offset`` to 64-bit, ids, map
indexes and try numbers to 32-bit, ``Search`` to 250 characters), and every request body is
a ``RequestBody``: strict types (no ``false`` for a number, no ``"1"`` for a boolean), no
unknown field, and in its JSON values (``conf``, ``extra``) no NaN or infinity, no NUL
character and no unpaired surrogate (neither database can store them), each refused with
422 saying where. Dates a request gives (``logical_date``, ``since``, ranges) are
``BoundedDate`` (a run's logical date, a partition range: years ``MIN_YEAR`` to ``MAX_YEAR``)
or ``FilterDate`` (``since``, a clear's dates: any year UTC can hold).
"""

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Generic, NoReturn, TypeVar

from fastapi import HTTPException, Path, Query
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    model_validator,
)
from sqlalchemy.orm import Session

from engine.api.storable import problem_in_value
from engine.db.database import Database
from engine.db.queries.assets import UnknownAssetError
from engine.exceptions import InvalidStateError, NotFoundError, OperatorActionError
from engine.views.common import MAX_INT32, MAX_LIMIT, MAX_OFFSET, MAX_SEARCH_LENGTH, PageError
from triggers.base import MAX_PARTITION_KEY_LENGTH

T = TypeVar("T")
R = TypeVar("R")

Limit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description=f"Items per page (at most {MAX_LIMIT})")
]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Items to skip")]
Search = Annotated[
    str | None,
    Query(
        max_length=MAX_SEARCH_LENGTH,
        description=f"Text the name contains (at most {MAX_SEARCH_LENGTH} characters)",
    ),
]
PartitionKey = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_PARTITION_KEY_LENGTH,
        description="Of this partition key only",
    ),
]
MapIndex = Annotated[
    int,
    Query(ge=-1, le=MAX_INT32, description="The copy of a mapped task (-1: an unmapped task)"),
]
TryNumber = Annotated[int | None, Query(ge=1, le=MAX_INT32, description="Default: the latest")]
RowId = Annotated[int, Path(ge=1, le=MAX_INT32, description="The row's id")]
IdFilter = Annotated[int | None, Query(ge=1, le=MAX_INT32, description="Of this id only")]

#: The years a run's logical date (and a partition range) may fall in: wide enough for any
#: schedule or backfill, narrow enough that a run is never dated where it would wait forever
#: (9999-12-31).
MIN_YEAR: Final = 1900
MAX_YEAR: Final = 2199
_ISO_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}[T ]")


def _date_text(value: Any) -> Any:
    """Dates come as ISO 8601 text: the number pydantic would read as a Unix time is refused
    (the document says ``format: date-time``)."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("a date must be ISO 8601 text with its offset, e.g. 2026-01-31T00:00:00Z")
    if not isinstance(value, str | datetime):
        raise ValueError("a date must be ISO 8601 text with its offset")
    return value


def _in_utc(value: datetime) -> datetime:
    """``value`` in UTC; a date that has none (0001-01-01 east of UTC) is refused."""
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("the date cannot be given in UTC (it is out of range)") from exc


def _sane_date(value: datetime) -> datetime:
    if not MIN_YEAR <= _in_utc(value).year <= MAX_YEAR:
        raise ValueError(f"the date must fall in the years {MIN_YEAR} to {MAX_YEAR}")
    return value


def _date_schema(pattern: str, years: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "pattern": pattern,
            "description": f"ISO 8601 with its offset, in the years {years}",
        }
    )


#: A date a run gets (``logical_date``) or a range is listed for: years MIN_YEAR..MAX_YEAR.
BoundedDate = Annotated[
    AwareDatetime,
    Strict(False),
    BeforeValidator(_date_text),
    AfterValidator(_sane_date),
    _date_schema("^(19[0-9]{2}|2[01][0-9]{2})-", f"{MIN_YEAR} to {MAX_YEAR}"),
]
#: A date a filter compares with (``since``, a clear's dates): any year 1..9999 that UTC
#: can hold (a far-future ``since`` is a fair question: its answer is empty).
FilterDate = Annotated[
    AwareDatetime,
    Strict(False),
    BeforeValidator(_date_text),
    AfterValidator(_in_utc),
    # documented as 0002..9998: the first and last years hold only with some offsets
    _date_schema(
        "^(000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-",
        "0002 to 9998",
    ),
]


class RequestBody(BaseModel):
    """A request body: strict types, no unknown field, JSON values a database can store."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if found := problem_in_value(value, str(key)):
                    raise ValueError(found)
        return data


class Page(BaseModel, Generic[T]):
    """One page of a list."""

    items: list[T]
    total: int = Field(description="Items in the whole filtered list")
    limit: int
    offset: int


def not_found(detail: str) -> NoReturn:
    raise HTTPException(404, detail)


def conflict(detail: str) -> NoReturn:
    raise HTTPException(409, detail)


def invalid(detail: str) -> NoReturn:
    raise HTTPException(422, detail)


def _answer(exc: Exception) -> NoReturn:
    """The HTTP answer to an error ``engine.db`` raised on purpose."""
    if isinstance(exc, NotFoundError | UnknownAssetError):
        not_found(str(exc))
    if isinstance(exc, InvalidStateError):
        conflict(str(exc))
    invalid(str(exc))


async def read(database: Database, fn: Callable[[Session], R]) -> R:
    """``fn(session)`` in a read-only transaction on a worker thread."""
    try:
        return await database.read(fn)
    except (PageError, OperatorActionError) as exc:
        _answer(exc)


async def act(database: Database, fn: Callable[[Session], R]) -> R:
    """``fn(session)`` in a writing transaction on a worker thread; a refused action is
    answered 404 / 409 / 422."""
    try:
        return await database.run(fn)
    except (OperatorActionError, UnknownAssetError) as exc:
        _answer(exc)


def found(value: R | None, detail: str) -> R:
    """``value``, or a 404 saying ``detail`` when it is None."""
    if value is None:
        not_found(detail)
    return value
