"""The ``CallbackSpec`` of a missed deadline (a ``deadline`` callback request the scheduler
wrote, ``engine.scheduler.deadlines``): the alert as stored when the deadline was set, and
the ``context`` Airflow gives a deadline callback, ``{"dag_run": ..., "deadline": {"id",
"deadline_time"}}``, its dates as ISO 8601 text; the run's id is both ``run_id`` and, as in
Airflow's, ``dag_run_id``. It runs in a callback process
(``engine.execution.deadline_callbacks``) and logs to the run's ``dag_callbacks.log``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from engine.db.queries import callbacks as callbacks_sql
from engine.db.queries import deadlines as deadlines_sql
from engine.execution.protocol import DEADLINE_CALLBACK, DEADLINE_KIND, CallbackSpec, TaskSpec
from triggers.serde import dumps

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.orm import Session


def _json(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def deadline_callback_spec(
    session: Session,
    request: callbacks_sql.Request,
    *,
    dags_folder: Path,
    plugins_folder: Path | None,
) -> CallbackSpec | None:
    """The spec of a missed deadline's callback; None when its run or deadline is gone."""
    run = callbacks_sql.load_callback_run(session, request.dag_id, request.run_id)
    if run is None:
        return None
    deadline_id = int(request.data["deadline_id"])
    try:
        index, deadline_time, alert = deadlines_sql.load_deadline(session, deadline_id)
    except LookupError:
        return None
    dag_run = {key: _json(value) for key, value in run.run.items()}
    task_spec = TaskSpec(
        ti_id=0,
        dag_id=request.dag_id,
        run_id=request.run_id,
        task_id="",
        fileloc=run.fileloc,
        try_number=1,
        try_started_at=str(dag_run.get("start_date") or dag_run.get("queued_at") or ""),
        context=dumps({}, where="a deadline callback"),
        dags_folder=str(dags_folder),
        plugins_folder=None if plugins_folder is None else str(plugins_folder),
    )
    context = {
        # dag_run_id: the name of the run id in Airflow's (its REST API's DAG run)
        "dag_run": {"dag_id": request.dag_id, "dag_run_id": request.run_id, **dag_run},
        "deadline": {"id": deadline_id, "deadline_time": deadline_time.isoformat()},
    }
    return CallbackSpec(
        kind=DEADLINE_KIND,
        callback=DEADLINE_CALLBACK,
        spec=task_spec.to_json(),
        deadline={"alert_index": index, "alert": alert, "context": context},
    )
