"""The read model: what the CLI, the REST API and the web UI show, composed once.

Each function takes a ``Session`` (one read transaction) and plain values and returns
JSON-able dicts and lists; a list is a page ``{items, total, limit, offset}`` with its
filters. The SQL is in ``engine.db.queries`` (``browse``, ``lineage``, ``inspection``,
``streams``); these modules decide what the rows mean and how they are shown:

- ``common``: pages, limits, ISO dates, JSON-able values;
- ``dags``: DAGs (schedule text, next run, paused, tags, last run states and counts; one
  DAG with its tasks, the watchers of its assets, its last runs);
- ``runs``: DAG runs (filters, pages; one run with its task instances and the asset events
  that triggered it);
- ``tasks``: task instances (per run, with map index, try, state, duration), a task's
  results (XComs), and the log file of a try, resolved safely inside the log folder;
- ``assets``: assets (watchers, last event, consuming DAGs, producing tasks), asset events
  (source watcher / task / API / CLI, payload, runs triggered), the asset graph;
- ``ops``: jobs (alive?), triggers and their owners (never their kwargs), shared-stream
  groups (lag per lane, advance rates, a short history);
- ``why``: why a DAG has not run (``explain_dag``).

Imports nothing, as ``engine.db`` does: import the modules themselves.
"""
