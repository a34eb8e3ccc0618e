"""A DAG's task graph as shown: its tasks with their downstream tasks and edge ``Label``s,
and the states of one run's task instances (the newest run, or the one asked for), with
the DAG's recent runs to choose from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypedDict

from engine.db.queries import browse
from engine.views.runs import RunDetails, show_run

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

#: Runs offered to choose from on the graph page (newest first).
CHOICE_RUNS: Final = 10


class GraphTaskShown(TypedDict):
    task_id: str
    operator: str
    downstream: list[str]
    edge_labels: dict[str, str]  # downstream task id -> the edge's Label


class RunChoice(TypedDict):
    run_id: str
    state: str
    queued_at: str


class DagGraphShown(TypedDict):
    dag_id: str
    tasks: list[GraphTaskShown]  # in the DAG's task order
    run: RunDetails | None  # the run whose states are shown (None: no run yet, or unknown)
    runs: list[RunChoice]  # the newest runs, newest first


def dag_graph(
    session: Session, dag_id: str, *, run_id: str | None, now: datetime
) -> DagGraphShown | None:
    """The DAG's tasks and edges, and the run ``run_id`` (None: the newest run) with its
    task instances; None if the DAG is unknown. An unknown ``run_id`` gives ``run`` None."""
    if browse.get_dag(session, dag_id) is None:
        return None
    recent = browse.last_runs(session, dag_id, last=CHOICE_RUNS)
    wanted = run_id if run_id is not None else (recent[0].run_id if recent else None)
    run = None if wanted is None else show_run(session, dag_id, wanted, now=now)
    return {
        "dag_id": dag_id,
        "tasks": [
            {
                "task_id": t.task_id,
                "operator": t.operator,
                "downstream": list(t.downstream_task_ids or []),
                "edge_labels": dict(t.edge_labels or {}),
            }
            for t in browse.dag_tasks(session, dag_id)
        ],
        "run": run,
        "runs": [
            {"run_id": r.run_id, "state": r.state, "queued_at": r.queued_at.isoformat()}
            for r in recent
        ],
    }
