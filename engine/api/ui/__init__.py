"""The web UI: server-rendered pages (Jinja2 templates in ``templates/``, extending
``base.html``), static files in ``static/`` (served at ``/static``), and ``router`` with every
page's route, mounted at ``/`` by ``engine.api.app``.

- ``templating``: ``render(request, name, context)`` and the shared page context;
- ``login``: ``/login`` and ``/logout``;
- ``rendering``: what the pages share (state looks, time filters, ``page(...)``);
- ``times``, ``values``: pure helpers behind ``rendering``'s filters: times as a person
  reads them (in sentences too), JSON escaped once, long values cut, class names;
- ``dag_pages``: ``/`` (to the DAG list), ``/dags``, ``/dags/{dag_id}`` (the runs grid),
  and the actions pause / unpause (each ``GET`` its confirmation, the ``POST`` the action);
- ``dag_graph_page``: ``/dags/{dag_id}/graph`` (the task graph, states of a run, groups
  folded on request) and ``/dags/{dag_id}/code`` (the file's source and ``doc_md``);
- ``trigger_page``: ``/dags/{dag_id}/trigger`` (the form from the DAG's params, then a
  confirmation, then the run);
- ``run_pages``: ``/dags/{dag_id}/runs/{run_id}``, a task's page with its log by try
  (``.../tasks/{task_id}``, ``.../log`` for the live tail);
- ``run_views``: a run's Gantt chart (``.../runs/{run_id}/gantt``) and a task instance's
  results (``.../tasks/{task_id}/results``);
- ``task_actions``: a task instance's mark success / failed and clear (``GET`` the
  confirmation, ``POST`` the action); ``run_actions``: a run's cancel and clear;
  ``confirming``: their confirmation page and message; ``flash``: the one-time message
  after an action (a cookie signed for the session);
- ``import_errors``: ``/import-errors``, the DAG files that fail to parse;
- ``asset_pages``: ``/assets``, ``/assets/{name}`` (events, emit), ``/asset-graph``;
- ``fleet_pages``: ``/jobs`` (the engine's parts, Celery workers and queues), ``/triggers``
  (by triggerer), ``/streams`` (shared-stream groups);
- ``why_page``: ``/dags/{dag_id}/why``;
- pure helpers: ``grid`` (the runs grid's rows), ``graph_layout`` (a layered layout),
  ``drawing`` (the asset graph as SVG paths), ``task_graph`` (a DAG's tasks, groups and
  labels to draw), ``gantt`` (a run's bars and axis), ``params_form`` (the trigger form's
  fields from ``Param``s, read back), ``sparkline``, ``states`` (a state's colour class,
  symbol and word).
"""

from fastapi import APIRouter

from engine.api.ui import (
    asset_pages,
    dag_graph_page,
    dag_pages,
    fleet_pages,
    import_errors,
    login,
    run_actions,
    run_pages,
    run_views,
    task_actions,
    trigger_page,
    why_page,
)

router = APIRouter()
for _pages in (
    login,
    dag_pages,
    dag_graph_page,
    trigger_page,
    run_pages,
    run_views,
    task_actions,
    run_actions,
    asset_pages,
    fleet_pages,
    import_errors,
    why_page,
):
    router.include_router(_pages.router)

__all__ = ("router",)
