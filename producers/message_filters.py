"""What the broker triggers' declarative filters share: pure, no broker client.

- ``body_filter``: ``lookup`` finds a dotted path in a JSON body, ``accepts`` compares with
  JSON equality (``true`` is not ``1``), ``body_matches`` holds every rule of a filter;
- ``apply_function``: ``function_path_problem`` checks its dotted path where the trigger is
  declared, ``load_apply_function`` imports it where the trigger runs, ``apply`` calls it
  (awaiting an async one);
- ``Rejected``: a watcher refuses a message (it takes the producer's dead-letter path).

Header, attribute and entry-field filters compare text with rules of their own broker (SQS
number attributes, Redis entry fields, NATS headers) and stay with their trigger.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Final

from producers.exceptions import EventFilterError, ProducerConfigError
from producers.partition_keys import is_dotted_path

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

#: ``lookup``'s answer for a path the document does not have
MISSING: Final = object()


class Rejected(Exception):
    """The message is refused by this watcher (dead-letter path); the text says why."""


def lookup(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of nested JSON objects, or ``MISSING``."""
    node = document
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def options_of(expected: Any) -> list[Any]:
    """A filter's accepted values: ``expected`` itself, or each of a list of them."""
    return expected if isinstance(expected, list) else [expected]


def accepts(expected: Any, actual: Any) -> bool:
    """``actual`` equals ``expected`` (or one of them, for a list); ``true`` is not ``1``.

    ``MISSING`` equals nothing.
    """
    if not isinstance(expected, list):  # the usual filter: one value, no generator
        return actual == expected and isinstance(actual, bool) == isinstance(expected, bool)
    return any(
        actual == option and isinstance(actual, bool) == isinstance(option, bool)
        for option in expected
    )


def body_matches(body_filter: Mapping[str, Any], body: dict[str, Any]) -> bool:
    """Every ``path -> expected`` rule of ``body_filter`` holds for the JSON object ``body``."""
    return all(accepts(expected, lookup(body, path)) for path, expected in body_filter.items())


def json_body_matches(body_filter: Mapping[str, Any], body: Any, what: str) -> bool:
    """``body_matches`` for a body that must be a JSON object: ``EventFilterError`` (the
    message is rejected) naming ``what`` when it is not."""
    if not isinstance(body, dict):
        raise EventFilterError(
            f"{what} has a body that is not a JSON object; body_filter {sorted(body_filter)} "
            "cannot apply"
        )
    return body_matches(body_filter, body)


def function_path_problem(path: str | None) -> str | None:
    """What is wrong with an ``apply_function`` path (None: nothing, or no function)."""
    if path is None or is_dotted_path(path):
        return None
    return f"apply_function must be a dotted path 'package.module.function', got {path!r}"


def load_apply_function(path: str, trigger_id: int | None) -> Callable[..., Any]:
    """The ``apply_function`` at ``path``, imported where the trigger runs;
    ``ProducerConfigError`` when it cannot be imported or is not callable."""
    module_name, _, name = path.rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ProducerConfigError(
            f"trigger {trigger_id}: cannot import apply_function {path!r}: {exc}; "
            "check the dotted path and that its module is importable by the triggerer"
        ) from exc
    if not callable(function):
        raise ProducerConfigError(f"trigger {trigger_id}: apply_function {path!r} is not callable")
    return function  # type: ignore[no-any-return]


async def apply(
    function: Callable[..., Any],
    message: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """``function(message, *args, **kwargs)``'s verdict, awaited when it is awaitable."""
    verdict = function(message, *args, **kwargs)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    return verdict
