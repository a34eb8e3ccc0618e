"""Writing trigger outcomes as the triggerer's persister does, without running its loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.db.database import Database
    from engine.triggerer.outbox import OutboxItem
    from engine.triggerer.persister import BatchResult, Persister


def persist(db: Database, persister: Persister, items: Sequence[OutboxItem]) -> BatchResult:
    """Write ``items`` as one batch in one transaction: ``Persister.prepare`` (a watcher
    event's payload encoded once), then ``Persister.write_prepared``, the persister's write
    of any batch that is not only watcher events within the size limit (those go in one
    statement: drive ``Persister.run`` through its outbox to take that path)."""
    return db.call(lambda session: persister.write_prepared(session, persister.prepare(items)))
