"""``@setup`` and ``@teardown``: TaskFlow tasks that are setup or teardown tasks (Airflow's
``airflow.sdk.setup`` / ``teardown``; what they mean: ``engine.authoring.setup_teardown``).

::

    @setup
    def create_cluster() -> str: ...

    @teardown(on_failure_fail_dagrun=True)
    def delete_cluster(cluster_id: str) -> None: ...

    cluster = create_cluster()
    run_job(cluster) >> delete_cluster(cluster)

Each decorates a plain function (a ``@task``) or an already decorated task of any flavour
(``@setup`` over ``@task.bash``); every task its calls add (``.expand`` ones too) is marked.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from engine.authoring.operators import TaskFactory, task
from engine.authoring.setup_teardown import mark_setup, mark_teardown

if TYPE_CHECKING:
    from collections.abc import Callable


class _MarkingPartial:
    """``@setup``-decorated ``.partial(...)``: its ``.expand`` marks the mapped task."""

    def __init__(self, partial: Any, mark: Callable[[object], None]) -> None:
        self._partial = partial
        self._mark = mark

    def expand(self, **mapped: Any) -> Any:
        return self._marked(self._partial.expand(**mapped))

    def expand_kwargs(self, kwargs_list: Any) -> Any:
        return self._marked(self._partial.expand_kwargs(kwargs_list))

    def _marked(self, operator: Any) -> Any:
        self._mark(operator)
        return operator


class RoleTaskFactory:
    """A task factory whose tasks are marked setup (or teardown) tasks as they are added."""

    def __init__(self, factory: TaskFactory, mark: Callable[[object], None], role: str) -> None:
        functools.update_wrapper(self, factory)
        self.factory = factory
        self.mark = mark
        self.role = role

    def __repr__(self) -> str:
        return f"<@{self.role} {self.factory!r}>"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.factory, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        operator = self.factory(*args, **kwargs)
        self.mark(operator)
        return operator

    def override(self, **operator_kwargs: Any) -> RoleTaskFactory:
        return RoleTaskFactory(self.factory.override(**operator_kwargs), self.mark, self.role)

    def partial(self, **fixed: Any) -> _MarkingPartial:
        return _MarkingPartial(self.factory.partial(**fixed), self.mark)

    def expand(self, **mapped: Any) -> Any:
        return self.partial().expand(**mapped)

    def expand_kwargs(self, kwargs_list: Any) -> Any:
        return self.partial().expand_kwargs(kwargs_list)


def _factory(function: Callable[..., Any] | TaskFactory | RoleTaskFactory) -> TaskFactory:
    if isinstance(function, RoleTaskFactory):
        return function.factory
    if isinstance(function, TaskFactory):
        return function
    made = task(function)
    assert isinstance(made, TaskFactory)  # task(fn) with a function is a factory
    return made


def setup(python_callable: Callable[..., Any] | TaskFactory) -> RoleTaskFactory:
    """Turn a function (or a decorated task) into a setup task: ``@setup``."""
    return RoleTaskFactory(_factory(python_callable), mark_setup, "setup")


def teardown(
    python_callable: Callable[..., Any] | TaskFactory | None = None,
    *,
    on_failure_fail_dagrun: bool = False,
) -> Any:
    """Turn a function (or a decorated task) into a teardown task: ``@teardown`` or
    ``@teardown(on_failure_fail_dagrun=True)`` (its failure then fails the run)."""

    def mark(operator: object) -> None:
        mark_teardown(operator, on_failure_fail_dagrun=on_failure_fail_dagrun)

    def decorate(function: Callable[..., Any] | TaskFactory) -> RoleTaskFactory:
        return RoleTaskFactory(_factory(function), mark, "teardown")

    return decorate if python_callable is None else decorate(python_callable)
