"""``DAG``: a named set of tasks with dependencies, started manually or by assets.

Use it as a context manager: every operator (or ``@task`` call) created inside the block
joins the DAG, and the DAG is registered for the DAG processor even if no variable holds
it::

    with DAG("orders", schedule=orders_asset & customers_asset):
        extract = PythonOperator(task_id="extract", python_callable=run_extract)
        load = PythonOperator(task_id="load", python_callable=run_load)
        extract >> load

``schedule`` takes None (manual runs only), an ``Asset``, a list of assets (all of them
updated) or an asset condition built with ``&`` and ``|``. A run started by assets can read
the asset events that started it from ``context["triggering_asset_events"]``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import as_condition
from engine.authoring.context import DagDefinitionError, caller_file_and_line

if TYPE_CHECKING:
    from types import TracebackType

    from engine.authoring.assets import BaseAsset
    from engine.authoring.operators import BaseOperator

ID_MAX_CHARS: Final = 250
_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]+")

_dag_stack: list[DAG] = []
_registered: list[DAG] = []


def check_id(kind: str, value: object, *, where: str) -> str:
    """A valid DAG or task id (letters, digits, ``_ . -``, at most 250 characters)."""
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
        raise DagDefinitionError(
            f"{where}: {kind} {value!r} is invalid; use letters, digits, '_', '.' and '-' only"
        )
    if len(value) > ID_MAX_CHARS:
        raise DagDefinitionError(f"{where}: {kind} is longer than {ID_MAX_CHARS} characters")
    return value


def current_dag() -> DAG | None:
    """The DAG of the innermost ``with DAG(...)`` block, if any."""
    return _dag_stack[-1] if _dag_stack else None


def take_registered_dags() -> list[DAG]:
    """The DAGs whose ``with`` block ended since the last call (the DAG processor's hook)."""
    dags = list(_registered)
    _registered.clear()
    return dags


class DAG:
    """A DAG: ``dag_id``, a schedule, and tasks linked by ``>>``."""

    def __init__(
        self,
        dag_id: str,
        *,
        schedule: BaseAsset | list[BaseAsset] | tuple[BaseAsset, ...] | None = None,
        description: str | None = None,
        auto_register: bool = True,
    ) -> None:
        self.fileloc, self.lineno = caller_file_and_line()
        where = f"{self.fileloc}:{self.lineno}"
        self.dag_id = check_id("dag_id", dag_id, where=where)
        self.schedule: BaseAsset | None = as_condition(schedule, where=where)
        if description is not None and not isinstance(description, str):
            raise DagDefinitionError(f"{where}: DAG {dag_id!r} description must be a string")
        self.description = description
        self.auto_register = auto_register
        self.task_dict: dict[str, BaseOperator] = {}

    def __repr__(self) -> str:
        return f"<DAG {self.dag_id!r} tasks={len(self.task_dict)} schedule={self.schedule!r}>"

    def __enter__(self) -> DAG:
        _dag_stack.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _dag_stack.remove(self)
        if exc_type is None and self.auto_register:
            _registered.append(self)

    @property
    def tasks(self) -> list[BaseOperator]:
        return list(self.task_dict.values())

    @property
    def task_ids(self) -> list[str]:
        return list(self.task_dict)

    def schedule_json(self) -> dict[str, Any] | None:
        """The schedule as stored in ``dag.schedule`` (None for manual runs only)."""
        return None if self.schedule is None else self.schedule.to_json()

    def add_task(self, task: BaseOperator) -> None:
        """Attach ``task``; its id must be new in this DAG."""
        if task.task_id in self.task_dict and self.task_dict[task.task_id] is not task:
            raise DagDefinitionError(
                f"DAG {self.dag_id!r} ({self.fileloc}) already has a task {task.task_id!r}; "
                "task ids must be unique within a DAG"
            )
        self.task_dict[task.task_id] = task

    def has_task(self, task_id: str) -> bool:
        return task_id in self.task_dict

    def get_task(self, task_id: str) -> BaseOperator:
        try:
            return self.task_dict[task_id]
        except KeyError:
            raise DagDefinitionError(
                f"DAG {self.dag_id!r} ({self.fileloc}) has no task {task_id!r}; it has "
                f"{sorted(self.task_dict)}"
            ) from None

    def check_cycles(self) -> None:
        """Raise ``DagDefinitionError`` naming a cycle of tasks, if there is one."""
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for root in self.task_dict:
            if root in state:
                continue
            path, stack = [root], [iter(self._downstream_of(root))]
            state[root] = 1
            while stack:
                child = next(stack[-1], None)
                if child is None:
                    state[path.pop()] = 2
                    stack.pop()
                elif state.get(child) == 1:
                    cycle = [*path[path.index(child) :], child]
                    raise DagDefinitionError(
                        f"DAG {self.dag_id!r} ({self.fileloc}) has a cycle: {' >> '.join(cycle)}"
                    )
                elif child not in state:
                    state[child] = 1
                    path.append(child)
                    stack.append(iter(self._downstream_of(child)))

    def topological_task_ids(self) -> list[str]:
        """Task ids, every task after all of its upstream tasks (ties in definition order)."""
        self.check_cycles()
        remaining = {tid: len(task.upstream_task_ids) for tid, task in self.task_dict.items()}
        ready = [tid for tid, count in remaining.items() if count == 0]
        order: list[str] = []
        while ready:
            tid = ready.pop(0)
            order.append(tid)
            for child in self._downstream_of(tid):
                remaining[child] -= 1
                if remaining[child] == 0:
                    ready.append(child)
        return order

    def _downstream_of(self, task_id: str) -> list[str]:
        return sorted(self.task_dict[task_id].downstream_task_ids)
