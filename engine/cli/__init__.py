"""The ``sluice`` command line, commands grouped by noun; the top of the house.

- ``main``: the root group ``cli``, ``sluice version``, and ``main()`` (the console script);
  it adds every other module's commands to the root group;
- ``processes``: ``run``, ``triggerer``, ``scheduler``, ``dag-processor``, ``executor``,
  ``api-server``;
- ``users``: ``users create|list|delete|set-password|set-role``, ``tokens create|list|revoke``;
- ``config``: ``config show``;
- ``db``: ``db migrate|check|reset|rotate-fernet-key``, and ``db clean`` from ``clean``;
- ``inspect``: ``dags``, ``runs``, ``assets`` (incl. ``assets emit``), ``tasks``;
- ``backfill``: ``dags backfill`` (added to the dags group by ``inspect``), plus the shared
  date / JSON-object parsing and ``cli_actor``;
- ``ops``: ``streams``, ``jobs``, ``triggers`` listings and ``doctor``;
- ``actions``: operator actions ``tasks clear``, ``tasks set-state``, ``runs cancel`` (added
  to the ``tasks`` and ``runs`` groups by ``main``);
- ``common``: what they share (config and database of the click context, failing with one
  line, table or JSON output, the ``--json`` option); imports no other module here.

No module imports ``main``. May import every part of the engine, through its public modules.
"""

from __future__ import annotations

from engine.cli.main import cli, main

__all__: tuple[str, ...] = ("cli", "main")
