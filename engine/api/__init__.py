"""The REST API and the web UI: one FastAPI application served by uvicorn.

A runtime part beside the DAG processor, scheduler, executor and triggerer (it never imports
them; they meet in ``engine.db``); it shows the read model, ``engine.views``, as the CLI
does. ``sluice api-server`` runs it alone and ``sluice run`` with
the other parts; its processes keep no state of their own (sessions and tokens live in the
metadata database), so several can run behind a load balancer.

- ``app``: ``create_app(config, database)``, the application: routers, problem-JSON errors,
  request limits and security headers (``problems``);
- ``security``: who is calling (bearer token or UI session), roles, CSRF; the FastAPI
  dependencies every route uses (``require_reader`` / ``require_operator`` /
  ``require_admin``, ``ui_reader`` / ``ui_operator``, ``verify_csrf``);
- ``credentials``: roles, password hashing, token and session secrets (no web framework:
  the CLI uses it too);
- ``deps``: the database and configuration of a request;
- ``rest``: the REST routers (``ROUTERS``, mounted at ``/api/v1``);
- ``ui``: the pages (``router``), their templates and static files;
- ``server``: running the application with uvicorn inside the engine's event loop.

Import from the modules themselves: this package imports nothing.
"""
