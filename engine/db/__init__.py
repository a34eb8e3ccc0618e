"""The metadata database: connection, models, migrations, and every SQL statement.

Owns the schema (``models/``, one module per table family; ``migrations/``) and the only
code that writes SQL: ``queries/``, one module per table family. ``database`` opens sessions
off the event loop, ``schema`` migrates and checks. Statements, not decisions: a query
function takes a ``Session`` and plain values, reads or writes, and returns rows or small
records; what they mean is decided by the part that owns the decision (which task a claim
admits: ``engine.executor``; what becomes of a dead executor's tries or a backfill's dates:
``engine.scheduler``) and shown by the read model (``engine.views``).

Raises its own errors: a database that cannot be reached for now is
``engine.exceptions.DatabaseUnavailable`` (retry), any other failure ``DatabaseError``, each
with SQLAlchemy's error as ``__cause__``; no SQLAlchemy exception leaves this package.

Also where other processes' writes can be heard (``listen``: the ``LISTEN`` connection, the
SQLite file; the parts' wake-up loop is ``engine.jobs``'s). May import: ``engine.authoring``,
the leaf utilities, ``triggers`` (serde) and ``shared_stream`` (statistics types); never a
runtime part, nor the read model. Import from the modules themselves: this package imports
nothing, so that ``engine.db.models`` comes without alembic.
"""
