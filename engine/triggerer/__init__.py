"""The triggerer: claims trigger rows, runs them in one event loop, persists what they fire.

Owns the claim loop (``claim_loop``: when to claim; ``triggerer``: one round, with the pure
claim policy and the round's transactions in ``claiming``, the step from claimed row to
trigger in ``loading``, the periodic upkeep in ``housekeeping``), the trigger runtime
(``runtime``: a trigger's own ``run()`` or its subscription to a shared stream; with
``attempts``, ``handles``, ``failures`` and ``cleanup``), the ``outbox`` every outcome goes
through (plain data and a queue, no database), the single ``persister`` that drains it, the
loop ``watchdog``, and the read access to the metadata database it gives the engine's own
triggers (``metadata``: ``ExternalTaskSensor``'s wait). Its job row and the wake-up on rows
other processes write are ``engine.jobs``'s.
An event goes one way: runtime -> outbox -> persister -> ``engine.db.queries.assets``.
May import: ``engine.jobs``, ``engine.db``, ``engine.authoring``, the leaf utilities,
``shared_stream`` and ``triggers``; never another runtime part.

Import from the modules themselves: like every runtime part, this package imports
nothing, so that importing one module never loads the rest.
"""
