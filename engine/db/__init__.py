"""The metadata database: connection, models, migrations, and every SQL statement.

Owns the schema (``models``, ``migrations/``) and the only code that writes SQL:
``queries/``, one module per table family. ``database`` opens sessions off the event loop,
``schema`` migrates and checks, ``heartbeat`` keeps a job row alive, ``clean`` runs
``sluice db clean``. Query functions take a ``Session`` and plain values and decide no
policy. May import: ``engine.authoring`` and the leaf utilities; never a runtime part.
"""

from __future__ import annotations

from engine.db.database import Database, create_db_engine, is_sqlite
from engine.db.heartbeat import heartbeat_forever
from engine.db.schema import (
    check_schema,
    current_revision,
    head_revision,
    migrate,
    reset,
    schema_drift,
)

__all__: tuple[str, ...] = (
    "Database",
    "check_schema",
    "create_db_engine",
    "current_revision",
    "head_revision",
    "heartbeat_forever",
    "is_sqlite",
    "migrate",
    "reset",
    "schema_drift",
)
