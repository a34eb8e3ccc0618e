"""The Airflow arguments of ``DAG`` and operators that Sluice does not implement (yet).

A ported DAG file passes Airflow's arguments. Each name falls in one of four groups:

- implemented: a named parameter of ``DAG`` / ``BaseOperator``;
- ignored: accepted, and one warning per name per process says it is ignored (e-mail,
  SLAs, templates ...). ``None`` and ``False`` are accepted silently: they ask for
  nothing, so ignoring them changes nothing;
- rejected when set: ignoring it would change what runs (``fail_fast`` ...), so a set value
  is a ``DagDefinitionError`` saying it is not supported yet;
- removed by Airflow itself (``schedule_interval``, ``concurrency`` ...): an error naming the
  replacement.

Any other name is an error naming it, with the closest known name: never a bare
``TypeError``. ``TriggerRule`` lives here too (the scheduler decides every rule:
``engine.advancing.rules``), with the checks every argument goes through (ids, types,
delays, ``default_args``) and ``warn_once``, the one warning per ignored name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from collections.abc import Iterable


logger = logging.getLogger(__name__)

TAG_MAX_CHARS: Final = 100
ID_MAX_CHARS: Final = 250
_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]+")
_warned: set[tuple[str, str]] = set()


class TriggerRule(StrEnum):
    """When a task runs, given the states of its upstream tasks (Airflow's values)."""

    ALL_SUCCESS = "all_success"
    ALL_FAILED = "all_failed"
    ALL_DONE = "all_done"
    ALL_DONE_MIN_ONE_SUCCESS = "all_done_min_one_success"
    ALL_DONE_SETUP_SUCCESS = "all_done_setup_success"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    ONE_DONE = "one_done"
    NONE_FAILED = "none_failed"
    NONE_FAILED_MIN_ONE_SUCCESS = "none_failed_min_one_success"
    NONE_SKIPPED = "none_skipped"
    ALL_SKIPPED = "all_skipped"
    ALWAYS = "always"


#: Every rule runs: ``engine.advancing.rules`` decides each as Airflow does (a test keeps its
#: table and this set equal).
SUPPORTED_TRIGGER_RULES: Final = frozenset(TriggerRule)


def check_trigger_rule(value: object, *, where: str) -> TriggerRule:
    """``value`` as a ``TriggerRule``; an unknown rule is an error."""
    try:
        rule = TriggerRule(value if isinstance(value, str) else "")
    except ValueError:
        raise DagDefinitionError(
            f"{where}: trigger_rule {value!r} is not a trigger rule; use one of "
            f"{[str(rule) for rule in TriggerRule]}"
        ) from None
    return rule


# --- DAG ------------------------------------------------------------------------------------

DAG_IGNORED: Final = frozenset(
    {
        "access_control",
        "default_view",
        "disable_bundle_versioning",
        "orientation",
        "owner_links",
        "sla_miss_callback",
    }
)
DAG_REJECTED_WHEN_SET: Final = frozenset({"fail_fast", "max_consecutive_failed_dag_runs"})
DAG_REMOVED: Final = {
    "schedule_interval": "schedule=",
    "timetable": "schedule=",
    "concurrency": "max_active_tasks=",
    "full_filepath": "nothing (the file is known)",
}

# --- operators ------------------------------------------------------------------------------

OPERATOR_IGNORED: Final = frozenset(
    {
        "allow_nested_operators",
        "depends_on_past",
        "doc",
        "doc_json",
        "doc_rst",
        "doc_yaml",
        "email",
        "email_on_failure",
        "email_on_retry",
        "end_date",
        "executor",
        "executor_config",
        "ignore_first_depends_on_past",
        "logger_name",
        "max_active_tis_per_dag",
        "max_active_tis_per_dagrun",
        "priority_weight",
        "resources",
        "run_as_user",
        "show_return_value_in_logs",
        "sla",
        "start_date",
        "templates_dict",
        "templates_exts",
        "wait_for_downstream",
        "wait_for_past_depends_before_skipping",
        "weight_rule",
    }
)
OPERATOR_REJECTED_WHEN_SET: Final[frozenset[str]] = frozenset()
OPERATOR_REMOVED: Final = {
    "task_concurrency": "max_active_tis_per_dag=",
    "provide_context": "nothing: parameters named like context keys receive them",
}


def asks_for_nothing(value: object) -> bool:
    """True for None and False: ignoring such an argument changes nothing."""
    return value is None or value is False


def split_unsupported(
    arguments: Mapping[str, object],
    *,
    owner: str,
    where: str,
    ignored: frozenset[str],
    rejected: frozenset[str],
    removed: Mapping[str, str],
    known: Iterable[str],
) -> list[str]:
    """The names to warn about (ignored and set); raise for rejected, removed and unknown ones.

    ``owner`` names the DAG or operator class in the error, ``known`` the implemented names
    (for "did you mean").
    """
    to_warn: list[str] = []
    for name, value in arguments.items():
        if name in ignored:
            if not asks_for_nothing(value):
                to_warn.append(name)
        elif name in rejected:
            if not asks_for_nothing(value) and value != 0:
                raise DagDefinitionError(
                    f"{where}: {owner} argument {name}={value!r} is not supported yet (ignoring "
                    "it would change what runs); remove it"
                )
        elif name in removed:
            raise DagDefinitionError(
                f"{where}: {owner} argument {name!r} was removed from Airflow; use "
                f"{removed[name]} instead"
            )
        else:
            import difflib  # only for this error: every DAG file and task process imports us

            choices = [*known, *ignored]
            close = difflib.get_close_matches(name, choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise DagDefinitionError(f"{where}: {owner} got an unknown argument {name!r}{hint}")
    return to_warn


# --- checks of argument values -----------------------------------------------------------------


def check_type(where: str, name: str, value: object, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DagDefinitionError(f"{where}: {name} must be {wanted}, got {value!r}")


def check_positive_int(where: str, name: str, value: object) -> int:
    check_type(where, name, value, int)
    assert isinstance(value, int)
    if value < 1:
        raise DagDefinitionError(f"{where}: {name} must be at least 1, got {value}")
    return value


def check_tags(where: str, tags: object) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, list | tuple | set | frozenset):
        raise DagDefinitionError(f"{where}: tags must be a list of strings, got {tags!r}")
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise DagDefinitionError(f"{where}: tags must be non-empty strings, got {tag!r}")
        if len(tag) > TAG_MAX_CHARS:
            raise DagDefinitionError(
                f"{where}: tag {tag[:20]!r}... is longer than {TAG_MAX_CHARS} characters"
            )
    return list(dict.fromkeys(sorted(tags) if isinstance(tags, set | frozenset) else tags))


def check_default_args(where: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise DagDefinitionError(f"{where}: default_args must be a dict, got {value!r}")
    return dict(value)


def check_timedelta(owner: str, name: str, value: object) -> timedelta | None:
    """``value`` if it is None or a non-negative ``timedelta``, else a clear error."""
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise DagDefinitionError(
            f"{owner}: {name} must be a datetime.timedelta or None, got {value!r}"
        )
    if value < timedelta(0):
        raise DagDefinitionError(f"{owner}: {name} must not be negative, got {value}")
    return value


def check_id(kind: str, value: object, *, where: str) -> str:
    """A valid DAG or task id (letters, digits, ``_ . -``, at most 250 characters)."""
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
        raise DagDefinitionError(
            f"{where}: {kind} {value!r} is invalid; use letters, digits, '_', '.' and '-' only"
        )
    if len(value) > ID_MAX_CHARS:
        raise DagDefinitionError(f"{where}: {kind} is longer than {ID_MAX_CHARS} characters")
    return value


def as_delay(where: str, name: str, value: object) -> timedelta | None:
    """A delay argument as Airflow takes it (``retry_delay``, ``max_retry_delay``): a
    ``timedelta`` or a number of seconds; None stays None."""
    problem = f"{where}: {name} must be a timedelta or a number of seconds, got {value!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise DagDefinitionError(f"{where}: {name} must not be negative, got {value!r}")
        try:
            value = timedelta(seconds=value)
        except (OverflowError, ValueError) as exc:  # inf, nan, beyond timedelta's range
            raise DagDefinitionError(problem) from exc
    elif value is not None and not isinstance(value, timedelta):
        raise DagDefinitionError(problem)
    return check_timedelta(where, name, value)


def warn_once(scope: str, argument: str, message: str, *args: object, **fields: str) -> None:
    """Log ``message`` once per process for each ``(scope, argument)``."""
    if (scope, argument) in _warned:
        return
    _warned.add((scope, argument))
    extra = {"action": "argument_ignored", "argument": argument, **fields}
    logger.warning(message, *args, extra=extra)


def forget_warnings() -> None:
    """Warn again about every argument (for tests)."""
    _warned.clear()
