"""The partition key a broker watcher gives the asset events it fires, taken from each message.

A Kafka or SQS watcher may key its events (Airflow 3.3's partitioned asset events: a DAG on
a ``PartitionedAssetTimetable`` runs once per key) by one of these, at most one per watcher:

- ``partition_key_field``: a dotted path into the JSON value (Kafka) or body (SQS),
  ``"region"`` or ``"order.region"``;
- ``partition_key_header`` (Kafka) / ``partition_key_attribute`` (SQS): a header's value
  (UTF-8 text) / a message attribute's value;
- ``partition_key_from_key=True`` (Kafka): the message's own key (UTF-8 text);
- ``partition_key_function``: the dotted path of a plain (not ``async``) function
  ``f(message) -> key``, given the ``KafkaMessage`` / ``SqsMessage`` the filter accepted.

The key is a non-empty string of at most 250 characters; an ``int`` or a ``float`` (a JSON
number) is written as text (``7`` -> ``"7"``, ``2.5`` -> ``"2.5"``). A message the filter
accepted but that gives no valid key (the field, header or attribute is missing, the value
is not text nor a number, or is empty or too long; the function returns such a value or
raises) is *rejected* by the watcher: it takes the broker's dead-letter path (Kafka's
``on_unclean``, SQS's ``on_reject``), with the reason, and the watcher moves on to the next
message. Why not store it without a key: a DAG that runs per key cannot use an unkeyed
event (its scheduler refuses it), so the message would be lost to the very consumer that
asked for keys, while a dead-lettered copy keeps it, with the reason, for a replay once
its producer is fixed.

This module holds the rule (``PartitionKeyRule``), its checks at construction, and the
formatting of a found value; each trigger reads the message's parts its own way.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from producers.exceptions import ProducerConfigError
from triggers.base import check_partition_key

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: a rule's source -> the keyword that selects it (the text of errors and of rejections)
OPTION_OF: Final[dict[str, str]] = {
    "field": "partition_key_field",
    "header": "partition_key_header",
    "attribute": "partition_key_attribute",
    "message_key": "partition_key_from_key",
    "function": "partition_key_function",
}


@dataclass(frozen=True, slots=True)
class PartitionKeyRule:
    """Where a watcher's events take their partition key from: ``source`` is ``field``,
    ``header``, ``attribute``, ``message_key`` or ``function``; ``name`` the field's dotted
    path, the header's or attribute's name, or the function's dotted path."""

    source: str
    name: str

    @property
    def option(self) -> str:
        return OPTION_OF[self.source]

    @property
    def path(self) -> tuple[str, ...]:
        """A field's dotted path, split."""
        return tuple(self.name.split("."))

    def describe(self) -> str:
        """The rule as written: ``partition_key_field='region'``."""
        if self.source == "message_key":
            return "partition_key_from_key=True"
        return f"{self.option}={self.name!r}"


def partition_key_rule(where: str, **options: Any) -> PartitionKeyRule | None:
    """The rule the watcher's ``partition_key_*`` keywords give (None: unkeyed events), or
    ``ProducerConfigError`` naming ``where`` for more than one, or one that cannot work."""
    given = {n: v for n, v in options.items() if v is not None and v is not False}
    if len(given) > 1:
        raise ProducerConfigError(
            f"{where}: give at most one of {sorted(given)}; each is a way to take the "
            "partition key from a message"
        )
    if not given:
        return None
    (option, value), *_ = given.items()
    source = next(s for s, o in OPTION_OF.items() if o == option)
    if source == "message_key":
        if value is not True:
            raise ProducerConfigError(f"{where}: partition_key_from_key must be True or False")
        return PartitionKeyRule(source, "")
    if not isinstance(value, str) or not value:
        raise ProducerConfigError(f"{where}: {option} must be a non-empty str, got {value!r}")
    if source == "field" and not all(value.split(".")):
        raise ProducerConfigError(
            f"{where}: partition_key_field {value!r} has an empty part; write a dotted path "
            "of JSON object keys, e.g. 'region' or 'order.region'"
        )
    if source == "function" and not is_dotted_path(value):
        raise ProducerConfigError(
            f"{where}: partition_key_function must be a dotted path "
            f"'package.module.function', got {value!r}"
        )
    return PartitionKeyRule(source, value)


def is_dotted_path(path: str) -> bool:
    parts = path.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def rule_kwargs(rule: PartitionKeyRule | None) -> dict[str, Any]:
    """The keyword that makes ``rule`` again (none for no rule: a stored trigger without
    a key rule serializes as it did before keys existed)."""
    if rule is None:
        return {}
    return {rule.option: True if rule.source == "message_key" else rule.name}


def load_key_function(rule: PartitionKeyRule, trigger_id: int | None) -> Callable[[Any], Any]:
    """The function a ``partition_key_function`` rule names, imported where the trigger
    runs; ``ProducerConfigError`` when it cannot be imported, is not callable or is async."""
    module_name, _, name = rule.name.rpartition(".")
    where = f"trigger {trigger_id}: partition_key_function {rule.name!r}"
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ProducerConfigError(
            f"{where} cannot be imported: {exc}; check the dotted path and that its module "
            "is importable by the triggerer"
        ) from exc
    if not callable(function):
        raise ProducerConfigError(f"{where} is not callable")
    if inspect.iscoroutinefunction(function):
        raise ProducerConfigError(
            f"{where} is async; the key is computed from the message alone: make it a "
            "plain function"
        )
    return function  # type: ignore[no-any-return]


class NoKey(Exception):
    """A message the rule gives no valid key for; the text says why (``rejection`` turns
    it into the reason the watcher rejects the message with)."""


def rejection(rule: PartitionKeyRule, problem: NoKey) -> str:
    """The reason a message without a valid key is rejected with (log and dead letter)."""
    return f"no partition key ({rule.describe()}): {problem}"


def key_text(value: Any, what: str) -> str:
    """``value`` (found as ``what``) as a partition key, or ``NoKey`` saying why not."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        kind = "null" if value is None else type(value).__name__
        raise NoKey(f"{what} is {kind}, not a partition key (a str, or a number)")
    if isinstance(value, float) and not math.isfinite(value):
        raise NoKey(f"{what} is {value}, not a partition key (a str, or a finite number)")
    text = value if isinstance(value, str) else str(value)
    try:
        return check_partition_key(text, what)
    except ValueError as exc:
        raise NoKey(str(exc)) from None


def field_key(document: Any, rule: PartitionKeyRule, *, document_name: str = "the value") -> str:
    """The key at the rule's dotted path in a decoded JSON ``document`` (the message's
    ``document_name``)."""
    node = document
    for depth, part in enumerate(rule.path):
        if not isinstance(node, dict):
            where = document_name if depth == 0 else f"field {'.'.join(rule.path[:depth])!r}"
            raise NoKey(f"{where} is not a JSON object")
        if part not in node:
            raise NoKey(f"field {rule.name!r} is missing")
        node = node[part]
    return key_text(node, f"field {rule.name!r}")


def named_key(values: Mapping[str, Any], rule: PartitionKeyRule, kind: str) -> str:
    """The key a header / an attribute named by the rule holds (bytes as UTF-8 text)."""
    what = f"{kind} {rule.name!r}"
    if rule.name not in values:
        raise NoKey(f"{what} is missing")
    return key_text(utf8(values[rule.name], what), what)


def utf8(value: Any, what: str) -> Any:
    """Bytes as UTF-8 text (``NoKey`` when they are not); anything else as it is."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise NoKey(f"{what} is not UTF-8 text") from None


def function_key(function: Callable[[Any], Any], message: Any) -> str:
    """What a ``partition_key_function`` returns for ``message``, as a key; its exception
    is the reason the message has none."""
    try:
        value = function(message)
    except Exception as exc:  # user code: its error is the message's rejection
        raise NoKey(f"the function raised {type(exc).__name__}: {exc}") from exc
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # never awaited: no "coroutine was never awaited" warning
        raise NoKey("the function returned an awaitable; it must return the key itself")
    return key_text(value, "the function's result")
