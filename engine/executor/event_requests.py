"""The asset events that triggered a task's run, served to its process page by page: the
kind ``triggering_events`` of the request channel (``engine.executor.task_requests``).

Theory of operation. A task's spec does not carry its run's triggering events: a run a
backlog drain created can hold tens of thousands, and most tasks never look at them. The
task process asks for them the first time its code reads ``triggering_asset_events``
(``engine.execution.triggering_events``), in pages in id order: ``after_id`` (None: from
the first) and ``limit`` rows at most (capped at ``PAGE_MAX_EVENTS``). The server answers
for the run of the try it supervises, never for a run the child names.

An answer is at most ``engine.channel.ANSWER_MAX_BYTES``: a page stops before the event that
would take it past ``PAGE_MAX_BYTES`` (``more`` then says that events remain). Each event is
encoded here once, with its payload as stored (tagged JSON, ``triggers.serde``): the
executor never decodes a payload into Python values and encodes it again; the task's process
decodes it once. An event too big for an answer on its own is an error naming it.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from engine.channel import ANSWER_MAX_BYTES
from engine.channel_server import EncodedValue, NotFoundError, RequestError
from engine.db.queries import run_context
from engine.executor.task_specs import event_fields

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.orm import Session

    from engine.db.database import Database
    from engine.db.queries.assets import EventRow

logger = logging.getLogger(__name__)

#: the most events one page holds, whatever the task asks for
PAGE_MAX_EVENTS: Final = 5_000
#: what a page's events may take: the answer's limit less room for its envelope
PAGE_MAX_BYTES: Final = ANSWER_MAX_BYTES - 1024


def event_json(event: EventRow) -> str:
    """One event as the task's process reads it (the keys of ``engine.execution.context``'s
    event dict; ``timestamp`` in ISO 8601, ``payload`` as stored)."""
    fields = event_fields(event, payload=event.payload, timestamp=event.timestamp.isoformat())
    return json.dumps(fields, separators=(",", ":"))


def page_text(events: list[EventRow], *, limit: int, max_bytes: int = PAGE_MAX_BYTES) -> str:
    """The answer's value: ``{"more": bool, "events": [...]}`` of the first of ``events``
    (read with one row past ``limit``) that fit in ``max_bytes``."""
    texts: list[str] = []
    size = 0
    for event in events[:limit]:
        text = event_json(event)
        if size + len(text) + 1 > max_bytes:
            if not texts:
                raise RequestError(
                    f"asset event {event.id} of {event.asset_name!r} is {len(text):,} bytes "
                    f"as JSON, over the request channel's limit of {max_bytes:,}: a task "
                    "cannot read it from triggering_asset_events"
                )
            break
        texts.append(text)
        size += len(text) + 1
    more = len(texts) < len(events)
    return f'{{"more":{json.dumps(more)},"events":[{",".join(texts)}]}}'


class TriggeringEventRequests:
    """The ``triggering_events`` kind for the run ``run_id`` of ``dag_id`` (None: the
    process belongs to no run, e.g. a deadline callback's)."""

    def __init__(
        self,
        *,
        db: Database,
        run: tuple[str, str] | None,
        log_fields: dict[str, Any] | None = None,
        max_bytes: int = PAGE_MAX_BYTES,
    ) -> None:
        self._db = db
        self._run = run
        self._log_fields = log_fields or {}
        self.max_bytes = max_bytes
        self.pages = 0

    def __repr__(self) -> str:
        return f"<TriggeringEventRequests run={self._run} pages={self.pages}>"

    def handlers(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {"triggering_events": self.triggering_events}

    async def triggering_events(self, *, after_id: int | None, limit: int) -> EncodedValue:
        if self._run is None:
            raise NotFoundError("this process belongs to no DAG run")
        if after_id is not None and not isinstance(after_id, int):
            raise RequestError("'after_id' must be an event id or null")
        if not isinstance(limit, int) or limit < 1:
            raise RequestError("'limit' must be a positive number of events")
        limit = min(limit, PAGE_MAX_EVENTS)
        dag_id, run_id = self._run
        read = partial(self._read, dag_id=dag_id, run_id=run_id, after_id=after_id, limit=limit)
        text = await self._db.read(read)
        self.pages += 1
        logger.debug(
            "Task request triggering_events: page %d of run %s after event %s",
            self.pages,
            run_id,
            after_id,
            extra={"action": "task_triggering_events_read", **self._log_fields},
        )
        return EncodedValue(text)

    def _read(
        self, session: Session, *, dag_id: str, run_id: str, after_id: int | None, limit: int
    ) -> str:
        """The page, encoded on the database's worker thread (the event loop's free)."""
        events = run_context.triggering_events_page(
            session, dag_id=dag_id, run_id=run_id, after_id=after_id, limit=limit + 1
        )
        if events is None:
            raise NotFoundError(f"run {run_id!r} of DAG {dag_id!r} does not exist any more")
        return page_text(events, limit=limit, max_bytes=self.max_bytes)
