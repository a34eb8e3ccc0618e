"""Setup and teardown tasks (Airflow's): a setup makes a resource, its teardown releases it.

A teardown runs once every task upstream of it finished, whatever they did, provided one of
its direct upstream setup tasks succeeded (its trigger rule is ``all_done_setup_success``,
decided by ``engine.advancing.rules``); and a run's state ignores a teardown's failure unless
it was marked ``on_failure_fail_dagrun=True``. So::

    create = create_cluster()          # a @setup task, or any task .as_setup()
    run_job(create) >> delete_cluster(create)  # a @teardown task, or .as_teardown(...)

    load >> report >> cleanup.as_teardown(setups=create_table)

``op.as_setup()`` marks a task as a setup; ``op.as_teardown(setups=..., on_failure_fail_dagrun=
...)`` marks it as a teardown, sets its trigger rule and links each setup to it (marking
them setups). A setup or teardown task is also a context manager: the tasks created inside
``with teardown:`` (or ``with setup:``) run between the setups and the teardowns::

    with delete_cluster(create_cluster()):
        run_job() >> check_job()

links ``create_cluster >> run_job`` and ``check_job >> delete_cluster``. The ``@setup`` and
``@teardown`` decorators are ``engine.authoring.setup_teardown_tasks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.authoring.arguments import TriggerRule
from engine.authoring.dependencies import AbstractOperator, DependencyMixin
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.dag import DAG


class SetupTeardownMixin:
    """What ``BaseOperator`` has of setups and teardowns: the marks, ``as_setup()`` /
    ``as_teardown()`` and the ``with`` block."""

    is_setup: bool = False
    is_teardown: bool = False
    #: a teardown whose failure fails the run (other teardowns' failures do not)
    on_failure_fail_dagrun: bool = False

    def as_setup(self) -> Any:
        """Mark this task as a setup task; returns it."""
        mark_setup(self)
        return self

    def as_teardown(
        self,
        *,
        setups: DependencyMixin | Sequence[DependencyMixin] | None = None,
        on_failure_fail_dagrun: bool | None = None,
    ) -> Any:
        """Mark this task as a teardown task (trigger rule ``all_done_setup_success``);
        ``setups`` are marked setup tasks and linked upstream of it. Returns it."""
        mark_teardown(self, on_failure_fail_dagrun=on_failure_fail_dagrun)
        for setup in _tasks_of(setups):
            mark_setup(setup)
            setup.set_downstream(self)  # type: ignore[arg-type]  # a task here
        return self

    def __enter__(self) -> Any:
        _scopes.append((self, _task_ids(self)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        owner, before = _scopes.pop()
        if exc_info[0] is None:
            _close_scope(owner, before)


def mark_setup(task: object) -> None:
    where = f"{caller_location()}: task {getattr(task, 'task_id', task)!r}"
    if getattr(task, "is_teardown", False):
        raise DagDefinitionError(f"{where} is a teardown task; it cannot also be a setup task")
    task.is_setup = True  # type: ignore[attr-defined]  # a SetupTeardownMixin


def mark_teardown(task: object, *, on_failure_fail_dagrun: bool | None = None) -> None:
    where = f"{caller_location()}: task {getattr(task, 'task_id', task)!r}"
    if getattr(task, "is_setup", False):
        raise DagDefinitionError(f"{where} is a setup task; it cannot also be a teardown task")
    if on_failure_fail_dagrun is not None and not isinstance(on_failure_fail_dagrun, bool):
        raise DagDefinitionError(f"{where}: on_failure_fail_dagrun must be a bool")
    task.is_teardown = True  # type: ignore[attr-defined]  # a SetupTeardownMixin
    task.trigger_rule = TriggerRule.ALL_DONE_SETUP_SUCCESS  # type: ignore[attr-defined]
    if on_failure_fail_dagrun is not None:
        task.on_failure_fail_dagrun = on_failure_fail_dagrun  # type: ignore[attr-defined]


def _tasks_of(value: object) -> list[AbstractOperator]:
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple | set) else [value]
    tasks: list[AbstractOperator] = []
    for item in items:
        operator = getattr(item, "operator", item)  # a task's result: its task
        if not isinstance(operator, AbstractOperator):
            raise DagDefinitionError(
                f"{caller_location()}: setups must be tasks (or their results), got {item!r}"
            )
        tasks.append(operator)
    return tasks


# --- ``with setup:`` / ``with teardown:`` ------------------------------------------------------

#: the setup or teardown tasks of the open ``with`` blocks, with the task ids their DAG had
_scopes: list[tuple[Any, frozenset[str]]] = []


def _dag_of(task: object) -> DAG | None:
    return getattr(task, "dag", None)


def _task_ids(task: object) -> frozenset[str]:
    dag = _dag_of(task)
    where = f"{caller_location()}: task {getattr(task, 'task_id', task)!r}"
    if not (getattr(task, "is_setup", False) or getattr(task, "is_teardown", False)):
        raise DagDefinitionError(
            f"{where}: only setup and teardown tasks open a `with` block; mark it with "
            ".as_setup() / .as_teardown() or the @setup / @teardown decorators"
        )
    if dag is None:
        raise DagDefinitionError(f"{where} belongs to no DAG; create it inside the DAG first")
    return frozenset(dag.task_dict)


def _close_scope(owner: Any, before: frozenset[str]) -> None:
    """Link the tasks created in the block between the scope's setups and teardowns."""
    dag = _dag_of(owner)
    if dag is None:
        return
    inside = [task for tid, task in dag.task_dict.items() if tid not in before]
    ids = {task.task_id for task in inside}
    roots = [t for t in inside if not (t.upstream_task_ids & ids)]
    leaves = [t for t in inside if not (t.downstream_task_ids & ids)]
    if owner.is_teardown:
        teardowns = [owner]
        setups = [dag.task_dict[u] for u in sorted(owner.upstream_task_ids)]
        setups = [s for s in setups if getattr(s, "is_setup", False)]
    else:
        setups = [owner]
        teardowns = [dag.task_dict[d] for d in sorted(owner.downstream_task_ids)]
        teardowns = [t for t in teardowns if getattr(t, "is_teardown", False)]
    for setup in setups:
        for root in roots:
            setup.set_downstream(root)
    for leaf in leaves:
        for teardown in teardowns:
            leaf.set_downstream(teardown)


def group_leaves(tasks: Sequence[AbstractOperator]) -> list[AbstractOperator]:
    """A task group's leaves as Airflow's: its tasks without downstream task in the group,
    except that a teardown leaf gives way to the tasks before it (stepping over teardowns,
    never back through a setup), so ``group >> next`` follows the group's work."""
    by_id = {task.task_id: task for task in tasks}
    found: list[AbstractOperator] = []

    def before_teardown(teardown: AbstractOperator) -> None:
        for up_id in sorted(teardown.upstream_task_ids):
            up = by_id.get(up_id)
            if up is None:
                continue
            if getattr(up, "is_teardown", False):
                before_teardown(up)
            elif not getattr(up, "is_setup", False) and up not in found:
                found.append(up)

    for task in tasks:
        if not task.downstream_task_ids.isdisjoint(by_id):
            continue
        if getattr(task, "is_teardown", False):
            before_teardown(task)
        elif task not in found:
            found.append(task)
    return found
