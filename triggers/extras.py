"""The optional packages of the ``sluice`` distribution: which extra installs which module.

``pip install sluice`` installs the engine and its built-in triggers; a broker client or the
Celery executor comes with an extra (``pip install 'sluice[kafka]'``, or ``[all]``).
``EXTRA_OF`` is the one table of the modules that only an extra installs. Code that needs
one checks for it before it imports it: a trigger class at construction (``require_extra``,
which finds the module without importing it, so that parsing a DAG file stays cheap and a
DAG using a trigger whose extra is missing fails to import with the line to run), and the
code that imports the client where the trigger runs (``importing_extra``, which turns a
failed import of such a module into the same error).
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from triggers.exceptions import MissingExtraError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ("EXTRA_OF", "importing_extra", "missing_extra", "require_extra")

#: top-level module -> the extra of the ``sluice`` distribution that installs it
EXTRA_OF: Final[Mapping[str, str]] = MappingProxyType(
    {
        "aiokafka": "kafka",
        "aiobotocore": "sqs",
        "botocore": "sqs",
        "aiohttp": "sqs",
        "aio_pika": "rabbitmq",
        "aiormq": "rabbitmq",
        "redis": "redis",
        "nats": "nats",
        "paho": "mqtt",
        "celery": "celery",
    }
)


def _message(module: str, needed_by: str) -> str:
    extra = EXTRA_OF[module]
    return (
        f"{needed_by} needs the {module!r} package, which is not installed: install the "
        f"{extra!r} extra (pip install 'sluice[{extra}]', or 'sluice[all]')"
    )


def missing_extra(module: str, *, needed_by: str) -> str | None:
    """Why ``needed_by`` cannot work here when ``module`` (a key of ``EXTRA_OF``) is not
    installed, else None. Finds the module without importing it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken installation: not importable either
        found = False
    return None if found else _message(module, needed_by)


def require_extra(module: str, *, needed_by: str) -> None:
    """Raise ``MissingExtraError`` when ``module`` is not installed (see ``missing_extra``)."""
    problem = missing_extra(module, needed_by=needed_by)
    if problem is not None:
        raise MissingExtraError(problem, name=module)


@contextmanager
def importing_extra(needed_by: str) -> Iterator[None]:
    """Around the import of a client: a module of ``EXTRA_OF`` that fails to import becomes
    the ``MissingExtraError`` naming ``needed_by`` and the extra (the original as cause)."""
    try:
        yield
    except ImportError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in EXTRA_OF:
            raise
        raise MissingExtraError(_message(top, needed_by), name=top) from exc
