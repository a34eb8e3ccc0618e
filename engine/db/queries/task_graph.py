"""A DAG's task graph as stored, and the walks over it that choose what a clear or a
state change touches: the tasks up- or downstream of some, and the setups and teardowns
that clearing a task clears with it (Airflow's rule)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from engine.db.models import Dag, DagTask
from engine.exceptions import NotFoundError

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from sqlalchemy.orm import Session


def dag_graph(session: Session, dag_id: str) -> dict[str, list[str]]:
    """The DAG's tasks and their direct downstream tasks; an unknown DAG is an error."""
    if session.get(Dag, dag_id) is None:
        raise NotFoundError(f"no DAG {dag_id!r}; see `sluice dags list`")
    rows = session.execute(
        select(DagTask.task_id, DagTask.downstream_task_ids).where(DagTask.dag_id == dag_id)
    )
    return {str(t): [str(d) for d in downstream or []] for t, downstream in rows}


def relatives(
    graph: Mapping[str, Iterable[str]], roots: Iterable[str], *, downstream: bool, upstream: bool
) -> set[str]:
    """``roots`` with, transitively, their downstream and / or upstream tasks."""
    up: dict[str, list[str]] = {}
    for task, children in graph.items():
        for child in children:
            up.setdefault(child, []).append(task)
    start = set(roots)
    found = set(start)
    edges = [e for e, wanted in ((graph, downstream), (up, upstream)) if wanted]
    for edge in edges:  # each direction from the roots alone (as Airflow's partial subset)
        todo = list(start)
        seen = set(start)
        while todo:
            for nxt in edge.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        found |= seen
    return found


def setup_teardown_roles(session: Session, dag_id: str) -> tuple[set[str], set[str]]:
    """The DAG's setup tasks and its teardown tasks."""
    rows = session.execute(
        select(DagTask.task_id, DagTask.is_setup, DagTask.is_teardown).where(
            DagTask.dag_id == dag_id
        )
    ).all()
    return {str(t) for t, s, _ in rows if s}, {str(t) for t, _, td in rows if td}


def with_setups_and_teardowns(
    graph: Mapping[str, Iterable[str]],
    task_ids: Iterable[str],
    setups: Collection[str],
    teardowns: Collection[str],
) -> set[str]:
    """``task_ids`` with the setups and teardowns that clearing them clears (Airflow's rule):
    for each task, every setup upstream of it that has no teardown or has one downstream of
    the task, with that setup's teardowns; for a setup, its own teardowns."""
    found = set(task_ids)
    for task in list(found):
        below = relatives(graph, [task], downstream=True, upstream=False)
        above = relatives(graph, [task], downstream=False, upstream=True) - {task}
        teardowns_below = below & set(teardowns)
        for setup in above & set(setups):
            its_teardowns = set(graph.get(setup, ())) & set(teardowns)
            if not its_teardowns or its_teardowns & teardowns_below:
                found |= {setup, *its_teardowns}
        if task in setups:
            found |= set(graph.get(task, ())) & set(teardowns)
    return found
