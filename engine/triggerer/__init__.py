"""The triggerer: claims trigger rows, runs them in one event loop, persists what they fire.

Owns the claim loop (``triggerer``, with the pure claim policy and the round's transactions
in ``claiming``, the step from claimed row to trigger in ``loading``, the periodic upkeep in
``housekeeping``), the trigger runtime (``runtime``: a trigger's own ``run()`` or its
subscription to a shared stream; with ``handles``, ``failures`` and ``cleanup``), the
``persister`` (the outbox every outcome goes through, and the single writer that drains it)
and the loop ``watchdog``. An event goes one way: runtime -> persister -> ``engine.db``.
May import: ``engine.db``, ``engine.authoring``, the leaf utilities, ``shared_stream`` and
``triggers``; never another runtime part.

Import from the modules themselves: this package imports nothing, so that a child
process that needs one module (the task runner, the DAG file parser) starts without the
rest (and without SQLAlchemy).
"""
