"""Advancing a run: its trigger rules' decisions (``rules``, pure), the expansion of mapped
tasks into their copies (``expansion``) and one pass over a run that writes them
(``advance``: ready tasks ``scheduled``, a finished run ended).

Shared by the scheduler, which advances every running run each loop, and the executor,
which advances the run of a task step it just recorded in the same transaction (Airflow's
``[scheduler] schedule_after_task_execution``, the "mini scheduler": the next task of a chain
is ready without waiting for a scheduler loop). May import ``engine.db``,
``engine.authoring`` and the leaf utilities; never a runtime part.

Import from the modules themselves: this package imports nothing.
"""
