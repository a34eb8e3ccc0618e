"""What the resource routers share: the page parameters and the page model, reading through
the read model (``engine.views``) and acting through ``engine.db`` off the event loop,
and the errors those raise as HTTP answers.

- an unknown DAG, run, task, asset or log: 404;
- an action that does not apply to the current state (a run already ended, a run that
  exists for that logical date): 409;
- any other refused action or bad value: 422.
"""

from collections.abc import Callable
from typing import Annotated, Generic, NoReturn, TypeVar

from fastapi import HTTPException, Query
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from engine.db.database import Database
from engine.db.queries.assets import UnknownAssetError
from engine.exceptions import InvalidStateError, NotFoundError, OperatorActionError
from engine.views.common import MAX_LIMIT, PageError
from triggers.base import MAX_PARTITION_KEY_LENGTH

T = TypeVar("T")
R = TypeVar("R")

Limit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description=f"Items per page (at most {MAX_LIMIT})")
]
Offset = Annotated[int, Query(ge=0, description="Items to skip")]
PartitionKey = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_PARTITION_KEY_LENGTH,
        description="Of this partition key only",
    ),
]
MapIndex = Annotated[
    int, Query(ge=-1, description="The copy of a mapped task (-1: an unmapped task)")
]


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
