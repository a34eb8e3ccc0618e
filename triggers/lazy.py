"""What the packages that load their names on first use (PEP 562: ``engine``,
``engine.authoring``, ``triggers``, ``producers``) share: a submodule looked up as an
attribute, and the ``__getattr__`` / ``__dir__`` of a package whose public names each come
from one of its modules."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType

__all__ = ("load_on_first_use", "submodule")


def submodule(package: str, name: str) -> ModuleType:
    """``package.name`` imported now (``triggers.temporal`` before anything imported it);
    AttributeError, as for any missing attribute, when there is no such module."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise  # the submodule exists and fails to import something of its own
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None


def load_on_first_use(
    package: str, module_of: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose public names
    (``module_of``: name -> the module that defines it) are imported on first use and kept
    as plain attributes; any other name is a submodule (``submodule``). Call it once the
    package's ``__all__`` is set."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            return submodule(package, name)
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
