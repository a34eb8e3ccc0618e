"""``SkipMixin`` and ``BranchMixIn``: an operator that skips tasks of its run (Airflow's).

::

    class ChooseRegions(BaseOperator, BranchMixIn):
        def execute(self, context):
            return self.do_branch(context, ["load_eu"])  # skips the other direct downstreams

    class SkipLoads(BaseOperator, SkipMixin):
        def execute(self, context):
            self.skip(context["ti"], tasks=[self.dag.get_task("load_us")])

The tasks are skipped as the try succeeds (how Sluice carries every branch decision:
``engine.authoring.branching``), as Airflow 3 skips them when its try ends; a try that fails
skips nothing. A skipped task's downstream tasks follow their trigger rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.baseoperator import BaseOperator
from engine.authoring.branching import branch_skips, follow_branch, skip_tasks
from engine.authoring.context import get_current_context
from engine.authoring.dependencies import AbstractOperator
from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from engine.authoring.context import Context


_WHAT: Final = "skip() takes tasks, task ids or (task id, map index) pairs"


def _task_ids(tasks: object) -> list[str]:
    items = [tasks] if isinstance(tasks, str | AbstractOperator | tuple) else tasks
    if not isinstance(items, Iterable):
        raise TypeError(
            f"skip() takes tasks, task ids or (task id, map index) pairs, got {tasks!r}"
        )
    ids: list[str] = []
    for item in items:
        if isinstance(item, AbstractOperator):
            ids.append(item.task_id)
        elif isinstance(item, str):
            ids.append(item)
        elif isinstance(item, tuple) and item and isinstance(item[0], str):
            ids.append(item[0])  # (task id, map index): the task's instances are skipped
        else:
            raise TypeError(
                f"skip() takes tasks, task ids or (task id, map index) pairs, got {item!r}"
            )
    return ids


class SkipMixin:
    """``skip`` and ``skip_all_except`` for an operator's ``execute``."""

    def _operator(self) -> BaseOperator:
        if not isinstance(self, BaseOperator):
            raise DagDefinitionError(f"{type(self).__name__}: SkipMixin is for operators")
        return self

    def skip(self, ti: object, tasks: Iterable[object], map_index: int = -1) -> None:
        """Skip ``tasks`` (operators, task ids or ``(task_id, map_index)``) of this run."""
        self._operator()
        skip_tasks(get_current_context(), _task_ids(tasks))

    def skip_all_except(self, ti: object, branch_task_ids: str | Iterable[str] | None) -> None:
        """Skip the direct downstream tasks that ``branch_task_ids`` does not follow."""
        skip_tasks(get_current_context(), branch_skips(self._operator(), branch_task_ids))


class BranchMixIn(SkipMixin):
    """``do_branch``: follow ``branches_to_execute``, skip the other direct downstream tasks."""

    def do_branch(self, context: Context, branches_to_execute: str | Iterable[str] | None) -> Any:
        """Skip what ``branches_to_execute`` does not follow; returns it (the result)."""
        return follow_branch(self._operator(), context, branches_to_execute)
