"""The web UI: server-rendered pages (Jinja2 templates in ``templates/``, extending
``base.html``), static files in ``static/`` (served at ``/static``), and ``router`` with every
page's route, mounted at ``/`` by ``engine.api.app``.

- ``templating``: ``render(request, name, context)`` and the shared page context;
- ``login``: ``/login`` and ``/logout``.
"""

from fastapi import APIRouter

from engine.api.ui import login

router = APIRouter()
router.include_router(login.router)

__all__ = ("router",)
