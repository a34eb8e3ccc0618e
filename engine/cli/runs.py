"""``sluice runs ...``: the runs of a DAG (list) and marking one failed (cancel: Airflow's
"mark run as failed", over ``engine.db.queries.run_ends``). Tables, or ``--json``.
"""

from __future__ import annotations

import json
from functools import partial

import click

from engine.cli.common import emit, fail, json_option, run_query
from engine.db import models
from engine.db.queries import dags as dags_sql
from engine.db.queries import run_ends
from engine.views import runs as runs_view


@click.group()
def runs() -> None:
    """DAG runs."""


@runs.command("list")
@click.argument("dag_id")
@click.option(
    "--partition-key", default=None, metavar="KEY", help="The runs of this partition only."
)
@json_option
@click.pass_context
def runs_list(ctx: click.Context, dag_id: str, partition_key: str | None, as_json: bool) -> None:
    """The runs of a DAG with their state, partition key, tasks and triggering asset
    events."""
    listed = run_query(
        ctx,
        lambda s: runs_view.list_runs(
            s,
            now=models.utcnow(),
            dag_id=dag_id,
            partition_key=partition_key,
            newest_first=False,
        ),
    )
    rows = [{k: r[k] for k in runs_view.RUN_KEYS} for r in listed["items"]]
    if not rows:
        _require_dag(ctx, dag_id)
    columns = ["run_id", "run_type", "state", "logical_date", "partition_key", "run_after"]
    columns += ["tasks", "asset_events"]
    emit(rows, columns, as_json)


def _require_dag(ctx: click.Context, dag_id: str) -> None:
    """Fail (exit 1) when no DAG has this id: an unknown DAG is not an empty answer."""
    if not run_query(ctx, lambda s: dags_sql.dag_exists(s, dag_id)):
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")


@runs.command("cancel")
@click.argument("dag_id")
@click.argument("run_id")
@json_option
@click.pass_context
def runs_cancel(ctx: click.Context, dag_id: str, run_id: str, as_json: bool) -> None:
    """Mark a queued or running run failed (Airflow's "mark run as failed").

    Running and deferred tasks become failed (their processes and triggers stopped);
    tasks not started, or waiting for a retry, become skipped.
    """
    cancel = partial(run_ends.cancel_run, dag_id=dag_id, run_id=run_id, now=models.utcnow())
    ended: run_ends.EndedRun = run_query(ctx, cancel, writes=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "state": ended.old_state,
                    "new_state": "failed",
                    "tasks": [c.as_dict() for c in ended.tasks],
                },
                indent=2,
            )
        )
        return
    click.echo(f"run {run_id} of {dag_id}: {ended.old_state} -> failed")
    emit([c.as_dict() for c in ended.tasks], ["task_id", "state", "new_state"], False)
