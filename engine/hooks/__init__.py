"""Hooks as DAG files import them (Airflow's ``airflow.hooks`` / ``BaseHook``): ``from
engine.hooks.base import BaseHook``. Connections themselves live in
``engine.authoring.connections``."""

from __future__ import annotations

from engine.hooks.base import BaseHook

__all__: tuple[str, ...] = ("BaseHook",)
