"""Retry policies (Airflow 3.3's ``airflow.sdk`` AIP-105): ``retry_policy=`` on a task
decides, from the exception that failed a try, whether it is retried, after how long, or
failed at once.

The family: ``RetryAction`` (``RETRY``, ``FAIL``, ``DEFAULT``), ``RetryDecision`` (what a
policy answers: an action, an optional delay for this retry, a reason), ``RetryPolicy``
(the base: subclass it and implement ``evaluate``), ``RetryRule`` (one exception-to-action
mapping) and ``ExceptionRetryPolicy`` (rules in order, the first match wins, else its
``default``).

How it composes with the task's own arguments, as Airflow documents it:

- the policy runs in the task process, on the exception of a failed try; a try whose
  process died without reporting (killed, out of memory, its executor gone) never reaches
  it and gets the task's standard retries;
- ``FAIL`` fails the task now, whatever retries are left (like ``AirflowFailException``);
- ``RETRY`` retries while the task's ``retries`` allow it (a policy can fail a task early,
  never run it more often): its ``retry_delay``, when given, is the wait before this retry,
  in place of ``retry_delay`` / ``retry_exponential_backoff`` / ``max_retry_delay``; without
  one the standard wait applies. With no tries left it is ``DEFAULT``;
- ``DEFAULT`` (and a policy that raises) is the standard rule;
- ``AirflowFailException`` and invalid params fail the task without asking the policy.

The decision is taken in ``engine.execution.retry_decisions`` and carried out by the
executor (``engine.executor.outcomes``).
"""

from __future__ import annotations

import abc
import enum
import importlib
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from engine.authoring.context import Context

logger = logging.getLogger(__name__)

__all__ = (
    "ExceptionRetryPolicy",
    "RetryAction",
    "RetryDecision",
    "RetryPolicy",
    "RetryRule",
)


class RetryAction(enum.Enum):
    """What happens after a failed try."""

    #: retry, within the task's ``retries`` (with no tries left it is ``DEFAULT``)
    RETRY = "retry"
    #: fail now, skipping the retries left
    FAIL = "fail"
    #: the task's standard retry rule
    DEFAULT = "default"


@dataclass(frozen=True)
class RetryDecision:
    """What a ``RetryPolicy`` answers for one failure."""

    action: RetryAction = RetryAction.DEFAULT
    #: the wait before this retry (``RETRY`` only); None: the task's own rule
    retry_delay: timedelta | None = None
    #: why, written to the task log with the outcome
    reason: str | None = None

    @classmethod
    def fail(cls, reason: str | None = None) -> RetryDecision:
        """Fail now, whatever retries are left."""
        return cls(action=RetryAction.FAIL, reason=reason)

    @classmethod
    def retry(cls, delay: timedelta | None = None, reason: str | None = None) -> RetryDecision:
        """Retry (within ``retries``), after ``delay`` if given."""
        return cls(action=RetryAction.RETRY, retry_delay=delay, reason=reason)

    @classmethod
    def default(cls) -> RetryDecision:
        """The task's standard retry rule."""
        return cls(action=RetryAction.DEFAULT)


class RetryPolicy(abc.ABC):
    """Base of retry policies: ``evaluate`` runs in the task process when a try fails, with
    the exception object; the executor only sees the decision."""

    @abc.abstractmethod
    def evaluate(
        self,
        exception: BaseException,
        try_number: int,
        max_tries: int,
        context: Context | None = None,
    ) -> RetryDecision:
        """Decide whether and how to retry.

        ``try_number`` is the failed try (from 1), ``max_tries`` the task's ``retries``,
        ``context`` the task's context (None when the task failed before it was built).
        Not called for ``AirflowFailException``, which always fails the task.
        """


#: one exception class, or the dotted import path of one
ExceptionSpec = type[BaseException] | str


@dataclass
class RetryRule:
    """One exception-to-action mapping of an ``ExceptionRetryPolicy``.

    ``exception``: a class, a dotted import path (``"requests.exceptions.HTTPError"``), or
    a list of either (the rule matches any). ``match_subclasses=False`` matches the exact
    type only. ``retry_delay`` and ``reason`` go into the decision when the rule matches.
    A path that does not import where the DAG is parsed is logged and may still import in
    the task process; one that does not import there never matches.
    """

    exception: ExceptionSpec | list[ExceptionSpec]
    action: RetryAction = RetryAction.RETRY
    retry_delay: timedelta | None = None
    reason: str | None = None
    match_subclasses: bool = True
    _resolved: list[type[BaseException]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        where = f"RetryRule(exception={self.exception!r})"
        specs = self.specs
        if not specs:
            raise DagDefinitionError(f"{where}: name at least one exception")
        for spec in specs:
            if isinstance(spec, str):
                if "." not in spec.strip(".") or not all(spec.split(".")):
                    raise DagDefinitionError(
                        f"{where}: {spec!r} is not a dotted import path; write it like "
                        "'builtins.ValueError' or pass the class"
                    )
                if _import_exception(spec) is None:
                    logger.warning(
                        "%s: %r does not import here; it may in the task process, check for a typo",
                        where,
                        spec,
                        extra={"action": "retry_rule_unresolved"},
                    )
            elif not (isinstance(spec, type) and issubclass(spec, BaseException)):
                raise DagDefinitionError(
                    f"{where}: {spec!r} is neither an exception class nor a dotted path"
                )
        if not isinstance(self.action, RetryAction):
            raise DagDefinitionError(f"{where}: action must be a RetryAction, got {self.action!r}")
        if self.retry_delay is not None and (
            not isinstance(self.retry_delay, timedelta) or self.retry_delay < timedelta(0)
        ):
            raise DagDefinitionError(
                f"{where}: retry_delay must be a timedelta >= 0, got {self.retry_delay!r}"
            )

    @property
    def specs(self) -> list[ExceptionSpec]:
        return list(self.exception) if isinstance(self.exception, list) else [self.exception]

    @property
    def exception_path(self) -> str:
        """The dotted path(s) of the rule's exceptions, comma-separated."""
        return ",".join(s if isinstance(s, str) else _path_of(s) for s in self.specs)

    def matches(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one of the rule's exceptions (or a subclass of one)."""
        classes = self._classes()
        if self.match_subclasses:
            return isinstance(exc, tuple(classes))
        return type(exc) in classes

    def _classes(self) -> list[type[BaseException]]:
        if self._resolved is None:
            found = []
            for spec in self.specs:
                cls = spec if isinstance(spec, type) else _import_exception(spec)
                if cls is None:
                    logger.warning(
                        "RetryRule: exception %r does not import; the rule will not match it",
                        spec,
                        extra={"action": "retry_rule_unresolved"},
                    )
                else:
                    found.append(cls)
            self._resolved = found
        return self._resolved


class ExceptionRetryPolicy(RetryPolicy):
    """Rules in order: the first whose exception matches decides (its action, delay and
    reason, or ``"Matched rule for <type>"``); when none does, ``default``."""

    def __init__(self, rules: list[RetryRule], default: RetryAction = RetryAction.DEFAULT) -> None:
        if not isinstance(rules, list | tuple) or not all(isinstance(r, RetryRule) for r in rules):
            raise DagDefinitionError(
                f"ExceptionRetryPolicy: rules must be a list of RetryRule, got {rules!r}"
            )
        if not isinstance(default, RetryAction):
            raise DagDefinitionError(
                f"ExceptionRetryPolicy: default must be a RetryAction, got {default!r}"
            )
        self.rules = list(rules)
        self.default = default

    def __repr__(self) -> str:
        return f"ExceptionRetryPolicy(rules={self.rules!r}, default={self.default})"

    def evaluate(
        self,
        exception: BaseException,
        try_number: int,
        max_tries: int,
        context: Context | None = None,
    ) -> RetryDecision:
        for rule in self.rules:
            if rule.matches(exception):
                return RetryDecision(
                    action=rule.action,
                    retry_delay=rule.retry_delay,
                    reason=rule.reason or f"Matched rule for {type(exception).__name__}",
                )
        return RetryDecision(action=self.default)


def check_retry_policy(where: str, value: object) -> RetryPolicy | None:
    """``retry_policy=`` of a task: a ``RetryPolicy`` or None."""
    if value is None or isinstance(value, RetryPolicy):
        return value
    raise DagDefinitionError(
        f"{where}: retry_policy must be a RetryPolicy (e.g. ExceptionRetryPolicy), got {value!r}"
    )


def _path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _import_exception(path: str) -> type[BaseException] | None:
    module, _, name = path.strip().rpartition(".")
    try:
        value: Any = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    if isinstance(value, type) and issubclass(value, BaseException):
        return value
    return None
