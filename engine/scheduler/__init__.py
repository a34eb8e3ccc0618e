"""The scheduler: asset conditions -> DAG runs -> ready task instances -> finished runs.

Owns the scheduling loop (``scheduler``) and its pure decisions (``rules``). May import:
``engine.db``, ``engine.authoring`` and the leaf utilities; never another runtime part.
"""

from __future__ import annotations

from engine.scheduler.scheduler import Scheduler, SchedulerSettings

__all__: tuple[str, ...] = ("Scheduler", "SchedulerSettings")
