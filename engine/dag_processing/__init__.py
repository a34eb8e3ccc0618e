"""The DAG processor: DAG files parsed in child processes, their results synced to the DB.

Owns the parse loop (``processor``), the child that imports one file (``parsing``), the
plan of what the tables should hold (``planning``, pure) and the transaction that writes
the differences (``sync``). May import: ``engine.jobs`` (its job row), ``engine.db``,
``engine.authoring`` and the leaf utilities; never another runtime part.

Import from the modules themselves: this package imports nothing, so that a child
process that needs one module (the task runner, the DAG file parser) starts without the
rest (and without SQLAlchemy).
"""
