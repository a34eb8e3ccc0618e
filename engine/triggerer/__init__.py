"""The triggerer: claims trigger rows, runs them in one event loop, persists what they fire.

Owns the claim loop (``triggerer``, with the pure claim policy in ``claiming``), the trigger
runtime (``runtime``: a trigger's own ``run()`` or its subscription to a shared stream),
the ``outbox`` every outcome goes through, the single ``persister`` and the loop
``watchdog``. May import: ``engine.db``, ``engine.authoring``, the leaf utilities,
``shared_stream`` and ``triggers``; never another runtime part.
"""

from __future__ import annotations

from engine.triggerer.triggerer import Triggerer, TriggererSettings

__all__: tuple[str, ...] = ("Triggerer", "TriggererSettings")
