"""The scheduler: asset conditions -> DAG runs -> ready task instances -> finished runs.

Owns the scheduling loop (``scheduler``; a run's advance, with its trigger rules and the
expansion of mapped tasks, is ``engine.advancing``'s, which the executor shares), a
time-scheduled DAG's due run (``time_runs``), the tries of dead executors (``orphans``) and
what a backfill does with each of its dates (``backfills``, also run by ``sluice dags
backfill``). May import: ``engine.jobs`` (its job row), ``engine.advancing``, ``engine.db``,
``engine.authoring`` and the leaf utilities; never another runtime part.

Import from the modules themselves: like every runtime part, this package imports
nothing, so that importing one module never loads the rest.
"""
