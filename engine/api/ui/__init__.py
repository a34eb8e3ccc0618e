"""The web UI: server-rendered pages (Jinja2 templates in ``templates/``, extending
``base.html``), static files in ``static/`` (served at ``/static``), and ``router`` with every
page's route, mounted at ``/`` by ``engine.api.app``.

- ``templating``: ``render(request, name, context)`` and the shared page context;
- ``login``: ``/login`` and ``/logout``;
- ``rendering``: what the pages share (state looks, time filters, ``page(...)``);
- ``times``, ``values``: pure helpers behind ``rendering``'s filters: times as a person
  reads them (in sentences too), JSON escaped once, long values cut, class names;
- ``dag_pages``: ``/`` (to the DAG list), ``/dags``, ``/dags/{dag_id}`` (the runs grid),
  and the actions pause / unpause / trigger;
- ``run_pages``: ``/dags/{dag_id}/runs/{run_id}``, a task's page with its log by try
  (``.../tasks/{task_id}``, ``.../log`` for the live tail) and the clear action;
- ``asset_pages``: ``/assets``, ``/assets/{name}`` (events, emit), ``/asset-graph``;
- ``fleet_pages``: ``/jobs`` (the engine's parts, Celery workers and queues), ``/triggers``
  (by triggerer), ``/streams`` (shared-stream groups);
- ``why_page``: ``/dags/{dag_id}/why``;
- pure helpers: ``grid`` (the runs grid's rows), ``graph_layout`` (a layered layout),
  ``drawing`` (the asset graph as SVG paths), ``sparkline``, ``states`` (a state's colour
  class, symbol and word).
"""

from fastapi import APIRouter

from engine.api.ui import asset_pages, dag_pages, fleet_pages, login, run_pages, why_page

router = APIRouter()
for _pages in (login, dag_pages, run_pages, asset_pages, fleet_pages, why_page):
    router.include_router(_pages.router)

__all__ = ("router",)
