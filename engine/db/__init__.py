"""The metadata database: connection, models, migrations, and every SQL statement.

Owns the schema (``models``, ``migrations/``) and the only code that writes SQL:
``queries/``, one module per table family. ``database`` opens sessions off the event loop,
``schema`` migrates and checks, ``heartbeat`` keeps a job row alive, ``clean`` runs
``sluice db clean``. Query functions take a ``Session`` and plain values and decide no
policy. May import: ``engine.authoring``, the leaf utilities, ``triggers`` (serde) and
``shared_stream`` (statistics types); never a runtime part. Import from the modules
themselves: this package imports nothing, so that ``engine.db.models`` comes without alembic.
"""
