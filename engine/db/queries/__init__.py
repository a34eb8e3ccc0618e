"""Every SQL statement of the engine, one module per table family.

- ``jobs``: job rows (start, heartbeat, end, capacity, liveness);
- ``triggers``: trigger rows (add, fetch, ownership, failures, key rotation, delete);
- ``claims``: claiming trigger rows, single and by shared-stream group;
- ``deferrals``: task instances deferred on a trigger (defer, resume, fail, time out);
- ``tasks``: task instances the executor holds (queue what a claim admitted, start, finish,
  requeue);
- ``run_context``: what a task's or callback's context reads of its run (the run, its
  triggering events, its tasks' results) and one task instance's results;
- ``orphans``: the task instances of dead executors (find them, a queued try back to
  ``scheduled``, a running one ended as the scheduler decided);
- ``pools``: slot pools, and what a claim reads to admit scheduled task instances (slots
  taken, active tasks per run, candidates);
- ``callbacks``: callback requests (a DAG's when its run ends, a killed try's) executors run;
- ``runs``: DAG runs (created, admitted under max_active_runs, advanced), their task states;
- ``advancing``: which running runs a scheduler loop advances (those with a task to decide);
- ``time_schedules``: time-scheduled DAGs (which are due, the row locked while deciding,
  the next run stored on the DAG row);
- ``actions``: operator actions on task instances (clear tasks, set a task's state); what the
  executor checks to stop a changed task;
- ``run_ends``: ending a run early (cancel, past its ``dagrun_timeout``);
- ``mapping``: the copies of mapped tasks (expand, states, results by ``map_index``);
- ``backfills``: backfill rows, the runs at their dates, completion; the DAG schedule
  columns the CLI shows;
- ``assets``: asset events from watchers, task outlets, aliases, the CLI and the API (insert,
  queue for DAGs, recent events for inlets);
- ``watcher_events``: the persister's bulk write of watcher events as asset events (one
  fixed-shape statement per batch, payloads as JSON text encoded once);
- ``dags``: what the DAG processor syncs (DAG files, parse errors, DAGs, tasks, assets,
  watchers, schedule edges to assets and aliases);
- ``streams``: shared-stream snapshots published by triggerers, and their samples;
- ``inspection``: what the operator views read (jobs and their load, running tries, Celery
  queue consumers, trigger rows, deferred tasks, failing watchers);
- ``browse``: the read model's paged DAG, run and task-instance lists and one DAG's rows;
- ``lineage``: the read model's assets, events, watchers, consumers and producers;
- ``partitions``: an asset's partition keys (events per key, the latest one), a DAG's runs
  and queued events per key (``sluice assets partitions``);
- ``clean``: which old rows ``sluice db clean`` may delete;
- ``why``, ``why_watchers``: what ``sluice dags why`` reads (queued events, runs, assets and
  their producing tasks; watchers, their triggerers and shared-stream groups);
- ``external_tasks``: another DAG's run and task states at given logical dates (read by the
  triggerer for ``ExternalTaskSensor``).

Functions take a ``Session`` (one transaction, opened by ``engine.db.Database``) and plain
values and return rows or small records; they read and write, they decide no policy and
word nothing (the read model, ``engine.views``, says what rows mean): which task a claim admits
(``engine.executor.admission``), when a failed try runs again (``engine.task_retries``),
what becomes of a dead executor's tries (``engine.scheduler.orphans``) and of a backfill's
dates (``engine.scheduler.backfills``) are decided by the parts that own them.
"""
