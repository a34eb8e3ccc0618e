"""The REST API, mounted at ``/api/v1`` by ``engine.api.app``: ``ROUTERS`` lists every
router. Each route depends on ``engine.api.security`` for who may call it, reads through
``engine.views`` and acts through ``engine.db`` (the same functions as the CLI).

- ``health``: ``/health`` (liveness), ``/health/ready`` (readiness);
- ``auth``: ``/me``, ``/tokens``, ``/users``;
- ``dags``: ``/dags`` (list, show, pause, unpause, trigger);
- ``runs``: ``/runs``, ``/dags/{dag_id}/runs`` (list, show, cancel);
- ``tasks``: ``/dags/{dag_id}/runs/{run_id}/tasks`` (list, show, logs, results, clear, set
  state) and ``/dags/{dag_id}/clear``;
- ``assets``: ``/assets``, ``/asset-events`` (list, emit), ``/asset-graph``;
- ``triggers``, ``jobs``, ``streams``: ``/triggers``, ``/jobs`` and ``/queues`` (tries per
  Celery queue), ``/streams``;
- ``why``: ``/dags/{dag_id}/why`` (``engine.views.why``);
- ``state_store``: ``/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/state-store`` and
  ``/asset-state-store/{name}`` (the task and asset state stores, read).

Errors are problem JSON: 404 for an unknown id, 409 for an action the current state does
not allow, 422 for bad input (every parameter bounded: ``rest.common``); the OpenAPI
document lists each operation's (``engine.api.openapi``). Lists are pages: ``?limit=``
(default 50, at most 500) and ``?offset=``, answered as ``{items, total, limit, offset}``.
"""

from fastapi import APIRouter

from engine.api.rest import (
    assets,
    auth,
    dags,
    health,
    jobs,
    runs,
    state_store,
    streams,
    tasks,
    triggers,
    why,
)

ROUTERS: list[APIRouter] = [
    health.router,
    auth.router,
    dags.router,
    runs.router,
    tasks.router,
    assets.router,
    triggers.router,
    jobs.router,
    streams.router,
    why.router,
    state_store.router,
]

__all__ = ("ROUTERS",)
