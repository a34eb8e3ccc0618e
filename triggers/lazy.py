"""What the packages that load their names on first use (PEP 562: ``engine``,
``engine.authoring``, ``triggers``) share: a submodule looked up as an attribute."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ("submodule",)


def submodule(package: str, name: str) -> ModuleType:
    """``package.name`` imported now (``triggers.temporal`` before anything imported it);
    AttributeError, as for any missing attribute, when there is no such module."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise  # the submodule exists and fails to import something of its own
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
