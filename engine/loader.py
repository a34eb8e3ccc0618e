"""Import a stored trigger classpath, but only from allowed modules.

A trigger row names the class to import. Importing runs module code, so the classpath is
checked first, without importing anything: its module must sit under one of the dotted
prefixes of ``[triggerer] allowed_trigger_modules``, or its top-level package must be a
file or package directly inside the plugins folder, or it must be one of the engine's own
trigger modules (``ENGINE_TRIGGER_MODULES``, always allowed: e.g. the trigger
``ExternalTaskSensor`` defers to).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from engine.exceptions import TriggerClassNotAllowedError, TriggerLoadError
from shared_stream.keys import UnstableKeyError, stream_key_digest
from triggers.base import BaseEventTrigger, BaseTrigger

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

ALLOWED_MODULES_CONFIG: Final = "[triggerer] allowed_trigger_modules"
#: The engine's own trigger modules, allowed whatever the configuration (exact names).
ENGINE_TRIGGER_MODULES: Final = frozenset({"engine.authoring.external_task_trigger"})
_MISSING: Final = object()


def _is_dotted_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _matches_prefix(module: str, prefix: str) -> bool:
    prefix = prefix.strip().rstrip(".")
    return bool(prefix) and (module == prefix or module.startswith(prefix + "."))


def _is_plugin_top_level(top: str, plugins_folder: Path) -> bool:
    return (plugins_folder / f"{top}.py").is_file() or (
        plugins_folder / top / "__init__.py"
    ).is_file()


def is_module_allowed(module: str, allowed: Sequence[str], *, plugins_folder: Path | None) -> bool:
    """True when ``module`` may be imported to load a trigger; never imports anything.

    Prefixes match on dotted boundaries (``triggers`` allows ``triggers.file``, not
    ``triggers_evil``). A module whose top-level name is a ``.py`` file or a package
    directly in ``plugins_folder`` is allowed as well.
    """
    if not _is_dotted_name(module):
        return False
    if module in ENGINE_TRIGGER_MODULES:
        return True
    if any(_matches_prefix(module, prefix) for prefix in allowed):
        return True
    top = module.partition(".")[0]
    return plugins_folder is not None and _is_plugin_top_level(top, plugins_folder)


def _split_classpath(classpath: str) -> tuple[str, str]:
    module, _, name = classpath.rpartition(".")
    if not module or not _is_dotted_name(module) or not name.isidentifier():
        raise TriggerLoadError(
            f"malformed trigger classpath {classpath!r}: expected 'package.module.ClassName'"
        )
    return module, name


def _not_allowed(
    classpath: str, allowed: Sequence[str], reason: str
) -> TriggerClassNotAllowedError:
    return TriggerClassNotAllowedError(
        f"refusing to import trigger class {classpath!r}: {reason}; allowed module prefixes "
        f"are {list(allowed)} ({ALLOWED_MODULES_CONFIG}) plus the modules of the plugins "
        f"folder. Add the module to {ALLOWED_MODULES_CONFIG} if it is trusted"
    )


def _add_to_sys_path(plugins_folder: Path) -> None:
    entry = str(plugins_folder.resolve())
    if entry not in sys.path:
        sys.path.append(entry)
        importlib.invalidate_caches()
        logger.debug(
            "Added plugins folder %s to sys.path",
            entry,
            extra={"action": "plugins_folder_added", "path": entry},
        )


def _check_plugin_origin(
    classpath: str, module: str, allowed: Sequence[str], plugins_folder: Path
) -> None:
    """Refuse a plugin module that another sys.path entry shadows (found, not imported)."""
    top = module.partition(".")[0]
    spec = sys.modules[top].__spec__ if top in sys.modules else importlib.util.find_spec(top)
    origin = None if spec is None else spec.origin
    folder = plugins_folder.resolve()
    if origin is None or not Path(origin).resolve().is_relative_to(folder):
        raise _not_allowed(
            classpath,
            allowed,
            f"module {top!r} resolves to {origin} instead of the plugins folder {folder}",
        )


def _import_module(module: str, classpath: str) -> object:
    try:
        return importlib.import_module(module)
    except (Exception, SystemExit) as exc:
        raise TriggerLoadError(
            f"cannot import trigger module {module!r} for {classpath}: {type(exc).__name__}: {exc}"
        ) from exc


def import_trigger_class(
    classpath: str, *, allowed: Sequence[str], plugins_folder: Path | None = None
) -> type[BaseTrigger]:
    """Import the ``BaseTrigger`` subclass named by ``classpath`` from an allowed module."""
    module, name = _split_classpath(classpath)
    if not is_module_allowed(module, allowed, plugins_folder=plugins_folder):
        raise _not_allowed(classpath, allowed, f"module {module!r} is not allowed")
    if plugins_folder is not None and plugins_folder.is_dir():
        _add_to_sys_path(plugins_folder)
        if module not in ENGINE_TRIGGER_MODULES and not any(
            _matches_prefix(module, prefix) for prefix in allowed
        ):
            _check_plugin_origin(classpath, module, allowed, plugins_folder)
    obj = getattr(_import_module(module, classpath), name, _MISSING)
    if obj is _MISSING:
        raise TriggerLoadError(f"module {module!r} has no attribute {name!r} ({classpath})")
    if not (isinstance(obj, type) and issubclass(obj, BaseTrigger)):
        raise TriggerLoadError(f"{classpath} is not a trigger class (a BaseTrigger subclass)")
    if inspect.isabstract(obj):
        raise TriggerLoadError(f"{classpath} is abstract and cannot be instantiated")
    return obj


def instantiate_trigger(
    cls: type[BaseTrigger], classpath: str, kwargs: Mapping[str, object]
) -> BaseTrigger:
    """``cls(**kwargs)``; what the constructor raises becomes a ``TriggerLoadError``."""
    try:
        return cls(**kwargs)
    except Exception as exc:
        # Only kwarg names: the values can be secrets.
        raise TriggerLoadError(
            f"cannot instantiate {classpath} with kwargs {sorted(kwargs)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def trigger_stream_digest(trigger: BaseTrigger, *, strict: bool = True) -> str | None:
    """The digest of ``trigger``'s shared-stream key; None when it shares no stream.

    A key that cannot be digested the same way in every process raises
    ``UnstableKeyError``; with ``strict=False`` it is logged and None is returned, and a
    ``shared_stream_key()`` that raises gives None (the runtime reports that failure).
    """
    if not isinstance(trigger, BaseEventTrigger):
        return None
    try:
        key = trigger.shared_stream_key()
        return None if key is None else stream_key_digest(key)
    except UnstableKeyError as exc:
        if strict:
            raise
        logger.warning(
            "Trigger %s: its shared stream cannot be kept on one triggerer: %s",
            type(trigger).__qualname__,
            exc,
            extra={"action": "stream_key_unstable"},
        )
        return None
    except Exception:
        if strict:
            raise
        return None
