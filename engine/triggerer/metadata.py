"""The triggerer's ``MetadataReader``: read access to the metadata database for the engine's
own triggers (``engine.authoring.external_task_trigger.MetadataReadingTrigger``).

The triggerer attaches one reader to each such trigger before starting it. Each read runs
one read-only transaction in a worker thread (``Database.read``), never on the event loop.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from engine.db.queries import external_tasks

if TYPE_CHECKING:
    from engine.authoring.external_task_trigger import ExternalQuery, ExternalStates
    from engine.db.database import Database

__all__ = ("DatabaseMetadataReader",)


class DatabaseMetadataReader:
    """``MetadataReader`` over the triggerer's ``Database``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"DatabaseMetadataReader({self._db!r})"

    async def external_states(self, query: ExternalQuery) -> ExternalStates:
        """The states of another DAG's runs and tasks (``engine.db.queries.external_tasks``)."""
        return await self._db.read(partial(external_tasks.read_external_states, query=query))
