"""The REST API, mounted at ``/api/v1`` by ``engine.api.app``: ``ROUTERS`` lists every
router. Each route depends on ``engine.api.security`` for who may call it and reads through
``engine.db`` (the same functions as the CLI).

- ``health``: ``/health`` (liveness), ``/health/ready`` (readiness);
- ``auth``: ``/me``, ``/tokens``, ``/users``.
"""

from fastapi import APIRouter

from engine.api.rest import auth, health

ROUTERS: list[APIRouter] = [health.router, auth.router]

__all__ = ("ROUTERS",)
