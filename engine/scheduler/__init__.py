"""The scheduler: asset conditions -> DAG runs -> ready task instances -> finished runs.

Owns the scheduling loop (``scheduler``) and its pure decisions (``rules``). May import:
``engine.db``, ``engine.authoring`` and the leaf utilities; never another runtime part.

Import from the modules themselves: this package imports nothing, so that a child
process that needs one module (the task runner, the DAG file parser) starts without the
rest (and without SQLAlchemy).
"""
