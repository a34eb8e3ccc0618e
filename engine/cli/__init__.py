"""The ``sluice`` command line, one module per noun as ``sluice --help`` groups them; the top
of the house.

- ``main``: the root group ``cli``, ``sluice version``, ``main()`` (the console script), and
  ``COMMANDS``, where every other command lives (imported when it runs or ``--help`` lists
  it);
- ``processes``: ``run``, ``triggerer``, ``scheduler``, ``dag-processor``, ``executor``,
  ``api-server``; ``celery``: ``celery worker``;
- ``config``: ``config show``;
- ``db``: ``db migrate|check|reset|rotate-fernet-key|clean``; ``db_clean``: what ``db clean``
  does (cut-offs, batches, counts, summary);
- ``users``: ``users create|list|delete|set-password|set-role``; ``tokens``:
  ``tokens create|list|revoke``;
- ``dags``: ``dags list|errors|show|pause|unpause|trigger|why`` (``why_text``: the text form
  of ``why``), and ``dags backfill`` from ``backfill``;
- ``runs``: ``runs list|cancel``; ``tasks``: ``tasks logs|result|clear|set-state``;
  ``assets``: ``assets list|events|emit``;
- ``connections``, ``variables``, ``pools``: their ``add|set``, ``list``, ``get`` and
  ``delete``;
- ``streams``, ``jobs``, ``triggers``: their ``list``; ``doctor``: ``doctor``;
- ``common``: what they share (config and database of the click context, failing with one
  line, running a query, table or JSON output, the ``--json`` option, dates and JSON objects
  typed on the command line, who is acting, the cipher of stored secrets); imports no other
  module here.

No module imports ``main``. May import every part of the engine, through its public modules.
"""

from __future__ import annotations

from engine.cli.main import cli, main

__all__: tuple[str, ...] = ("cli", "main")
