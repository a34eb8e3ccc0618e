"""The read model: what the CLI, the REST API and the web UI show, composed once.

Each function takes a ``Session`` (one transaction) and plain values and returns typed
records: ``TypedDict``s, since their JSON shape is the contract the REST API answers and
``--json`` prints (keys are only ever added). A list is a ``common.Page`` ``{items, total,
limit, offset}`` with its filters. The SQL is in ``engine.db.queries`` (``browse``,
``lineage``, ``partitions``, ``inspection``, ``streams``, ``why``, ``why_watchers``); these
modules decide what the rows mean and say it in words:

- ``common``: pages, limits, ISO dates, JSON-able values;
- ``dags``: DAGs (schedule text, next run, paused, tags, last run states and counts; one
  DAG with its tasks, the watchers of its assets, its last runs);
- ``runs``: DAG runs (filters, pages; one run with its task instances and the asset events
  that triggered it);
- ``tasks``: task instances (per run, with map index, try, state, duration), a task's
  results (XComs), and the log file of a try, resolved safely inside the log folder;
- ``assets``: assets (watchers, last event, consuming DAGs, producing tasks), asset events
  (source watcher / task / API / CLI, partition key, payload, runs triggered), the asset
  graph; ``partitions``: an asset's partition keys (events, the latest one, the keys a
  producer's ``CronPartitionTimetable`` expects in a range) and each per-key consumer's run;
- ``jobs``: the engine's jobs (alive?, load, the tries an executor runs) and the Celery
  queues; ``triggers``: trigger rows and their owners (never their kwargs); ``streams``:
  shared-stream groups (lag per lane, advance rate, a short history);
- ``parse_errors``: the DAG files that fail to parse (``sluice dags errors``, the UI's
  import errors);
- ``doctor``: the facts ``sluice doctor`` judges (``engine.doctor``);
- ``why``: why a DAG has not run (``explain_dag``; its shape ``why_records``, its
  judgements ``why_entries`` and ``why_findings``; a partitioned DAG's waiting keys in
  words ``why_partitions``);
- ``operations``: what an operator does that takes more than one statement (trigger a run).

May import ``engine.db``, ``engine.authoring`` and the leaf utilities; imported by
``engine.api`` and ``engine.cli``, never by a runtime part (the import contracts say so).
Imports nothing itself: import the modules.
"""
