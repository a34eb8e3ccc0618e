"""``default_args``: the arguments a DAG (and its task groups) give the operators created in
them, filling what the operator's caller did not pass.

Each ``BaseOperator`` subclass's ``__init__`` is wrapped (``applies_default_args``, done by
``BaseOperator.__init_subclass__``): the outermost ``__init__`` of a new operator fills its
keyword arguments from the DAG's ``default_args``, then its task groups', then its own
``default_args=``, keeping only the names the operator class accepts
(``accepted_arguments``). Once the operator is built, a task result given to one of its
``template_fields`` makes that task upstream.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.arguments import (
    OPERATOR_IGNORED,
    OPERATOR_REJECTED_WHEN_SET,
    check_default_args,
)
from engine.authoring.dag import DAG, TaskContainer, current_dag, current_group
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.xcom import iter_references

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.authoring.dependencies import AbstractOperator

# Never filled from default_args: the task's identity and place, and the DAG's own dates.
_NOT_DEFAULTED: Final = frozenset(
    {"self", "task_id", "dag", "task_group", "default_args", "start_date", "end_date"}
)
DEFAULT_ARGS_MARK: Final = "_sluice_default_args_applied"
_KEYWORD_KINDS: Final = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


_accepted: dict[type, frozenset[str]] = {}


def accepted_arguments(cls: type[AbstractOperator]) -> frozenset[str]:
    """The argument names ``cls`` accepts (its ``__init__`` chain and Airflow's ignored ones)."""
    if cls not in _accepted:
        _accepted[cls] = _accepted_by(cls)
    return _accepted[cls]


def prime_accepted_arguments(root: type[AbstractOperator]) -> int:
    """Fill the cache of ``accepted_arguments`` for every operator class defined so far: a
    pre-imported runner (the executor's warm runner, the DAG processor's parse runner) does
    it once before it forks, so that each child's DAG file does not work it out afresh for
    each class (``inspect.signature`` over each ``__init__`` of its MRO, the dearest part of
    a small DAG file's import): ``root`` (``BaseOperator``) and every subclass of it.
    Returns how many classes."""
    pending: list[type[AbstractOperator]] = [root]
    seen: set[type[AbstractOperator]] = set()
    while pending:
        cls = pending.pop()
        if cls not in seen:
            seen.add(cls)
            pending.extend(cls.__subclasses__())
            try:
                accepted_arguments(cls)
            except Exception:  # noqa: BLE001 - an odd operator: its children work it out (and fail) alone
                continue
    return len(seen)


def _accepted_by(cls: type[AbstractOperator]) -> frozenset[str]:
    names: set[str] = set(OPERATOR_IGNORED) | OPERATOR_REJECTED_WHEN_SET
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        parameters = inspect.signature(init).parameters.values()
        names.update(p.name for p in parameters if p.kind in _KEYWORD_KINDS)
    return frozenset(names - _NOT_DEFAULTED)


def _group_for(dag: object, group: object) -> TaskContainer | None:
    """The task group a new task joins: ``task_group=``, else the innermost of its DAG."""
    if group is not None:
        if not callable(getattr(group, "child_id", None)):
            raise DagDefinitionError(
                f"{caller_location()}: task_group must be a TaskGroup, got {group!r}"
            )
        return group  # type: ignore[return-value]  # a TaskGroup (checked above)
    inner = current_group()
    return inner if inner is not None and (dag is None or inner.dag is dag) else None


def with_default_args(cls: type[AbstractOperator], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus the default_args (DAG, then groups, then the operator's own) it lacks."""
    target = kwargs.get("dag") or current_dag()
    group = _group_for(kwargs.get("dag"), kwargs.get("task_group"))
    defaults: dict[str, Any] = {}
    if isinstance(target, DAG):
        defaults.update(target.default_args)
    elif group is not None:
        defaults.update(group.dag.default_args)
    if group is not None:
        defaults.update(group.default_args)
    own = kwargs.pop("default_args", None)
    defaults.update(check_default_args(caller_location(), own))
    accepted = accepted_arguments(cls)
    filled = {k: v for k, v in defaults.items() if k in accepted and k not in kwargs}
    if isinstance(defaults.get("params"), dict) and isinstance(kwargs.get("params"), dict):
        filled["params"] = {**defaults["params"], **kwargs["params"]}
    return {**kwargs, **filled}


def applies_default_args(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap an operator's ``__init__``: the outermost call fills arguments from default_args."""

    @functools.wraps(init)
    def wrapper(self: AbstractOperator, *args: Any, **kwargs: Any) -> None:
        if self.__dict__.get(DEFAULT_ARGS_MARK):
            init(self, *args, **kwargs)
            return
        self.__dict__[DEFAULT_ARGS_MARK] = True
        init(self, *args, **with_default_args(type(self), kwargs))
        _depend_on_referenced_results(self)

    setattr(wrapper, DEFAULT_ARGS_MARK, True)
    return wrapper


def _depend_on_referenced_results(operator: AbstractOperator) -> None:
    """A task result given to a template field (``values=other.output``) makes its task
    upstream, as in Airflow: the value is pulled when the field is rendered."""
    for name in getattr(operator, "template_fields", ()):
        for reference in iter_references(getattr(operator, name, None)):
            operator.set_upstream(reference)
