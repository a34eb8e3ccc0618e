"""The web UI: server-rendered pages (Jinja2 templates in ``templates/``, extending
``base.html``), static files in ``static/`` (served at ``/static``), and ``router`` with every
page's route, mounted at ``/`` by ``engine.api.app``.

- ``templating``: ``render(request, name, context)`` and the shared page context;
- ``login``: ``/login`` and ``/logout``;
- ``rendering``: what the pages share (state looks, time filters, ``page(...)``);
- ``why_page``: ``/dags/{dag_id}/why``;
- pure helpers: ``graph_layout`` (a layered layout), ``drawing`` (the asset graph as
  SVG paths), ``sparkline``, ``states`` (a state's colour class, symbol and word).
"""

from fastapi import APIRouter

from engine.api.ui import login, why_page

router = APIRouter()
router.include_router(login.router)
router.include_router(why_page.router)

__all__ = ("router",)
