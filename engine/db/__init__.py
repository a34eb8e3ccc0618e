"""The metadata database: connection, models, migrations, and every SQL statement.

Owns the schema (``models``, ``migrations/``) and the only code that writes SQL:
``queries/``, one module per table family. ``database`` opens sessions off the event loop,
``schema`` migrates and checks, ``heartbeat`` keeps a job row alive, ``clean`` runs
``sluice db clean``. Query functions take a ``Session`` and plain values and decide no
policy. ``views/`` is the read model the CLI, the REST API and the UI show (it composes
queries into JSON-able pages, no SQL of its own); ``operations`` the operator actions that
take more than one query (triggering a DAG). May import: ``engine.authoring``, the leaf
utilities, ``triggers`` (serde) and ``shared_stream`` (statistics types); never a runtime
part. Import from the modules themselves: this package imports nothing, so that
``engine.db.models`` comes without alembic.
"""
