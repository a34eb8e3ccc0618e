"""Operator actions: ``sluice tasks clear``, ``sluice tasks set-state``, ``sluice runs
cancel`` (Airflow 3's clear, mark success / failed / skipped, and mark run failed).

The logic is in ``engine.db.queries.actions`` (what the REST API will call too); these
commands parse, confirm, and print what was done. What still runs for a changed task (its
process, its trigger) is stopped by the engine within a heartbeat.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

import click

from engine.authoring.timetables import timezone_of
from engine.cli.backfill import parse_date
from engine.cli.common import emit, fail, format_table, json_option, run_query
from engine.db.models import utcnow
from engine.db.queries import actions, run_ends
from engine.db.queries import backfills as backfills_sql

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

_COLUMNS = ["run_id", "task_id", "state", "new_state"]


def _print_changes(
    changes: Sequence[actions.TaskChange], run_states: dict[str, str], as_json: bool
) -> None:
    if as_json:
        click.echo(
            json.dumps({"tasks": [c.as_dict() for c in changes], "runs": run_states}, indent=2)
        )
        return
    if changes:
        click.echo(format_table([c.as_dict() for c in changes], _COLUMNS))
    else:
        click.echo("no task instance changed")
    for run_id, state in sorted(run_states.items()):
        click.echo(f"run {run_id}: {state}")


def _date(ctx: click.Context, dag_id: str, text: str | None, option: str) -> datetime | None:
    """A ``--start-date`` / ``--end-date``; a naive one is in the DAG's time zone."""
    if text is None:
        return None
    sched = run_query(ctx, lambda s: backfills_sql.dag_schedules(s, [dag_id]), writes=False)
    if dag_id not in sched:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    return parse_date(text, timezone=timezone_of(sched[dag_id].timezone), option=option)


@click.command("clear")
@click.argument("dag_id")
@click.option("--run", "run_id", default=None, help="Only this run (default: every run).")
@click.option("-s", "--start-date", "start_text", default=None, metavar="DATE",
              help="Only runs with a logical date at or after DATE.")  # fmt: skip
@click.option("-e", "--end-date", "end_text", default=None, metavar="DATE",
              help="Only runs with a logical date at or before DATE.")  # fmt: skip
@click.option("-t", "--task-regex", default=None, help="Only tasks whose id matches (re.search).")
@click.option("-d", "--downstream", is_flag=True, help="Also their downstream tasks.")
@click.option("-u", "--upstream", is_flag=True, help="Also their upstream tasks.")
@click.option("-f", "--only-failed", is_flag=True, help="Only failed and upstream_failed ones.")
@click.option("-r", "--only-running", is_flag=True, help="Only running ones.")
@click.option("--map-index", type=int, default=None, help="Only this copy of mapped tasks.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def tasks_clear(
    ctx: click.Context,
    dag_id: str,
    run_id: str | None,
    start_text: str | None,
    end_text: str | None,
    task_regex: str | None,
    downstream: bool,
    upstream: bool,
    only_failed: bool,
    only_running: bool,
    map_index: int | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Clear task instances so that the scheduler runs them again.

    A cleared task gets its retries again; a deferred one's trigger is removed, a running
    one's process is stopped (it is `restarting` until then); a finished run of a cleared
    task goes back to queued. Without --yes, lists what it would clear and asks.
    """
    select = partial(
        actions.select_task_instances,
        dag_id=dag_id,
        run_id=run_id,
        start_date=_date(ctx, dag_id, start_text, "--start-date"),
        end_date=_date(ctx, dag_id, end_text, "--end-date"),
        task_regex=task_regex,
        downstream=downstream,
        upstream=upstream,
        only_failed=only_failed,
        only_running=only_running,
        map_index=map_index,
    )
    found: list[actions.TaskChange] = run_query(ctx, select, writes=False)
    if not found:
        click.echo("no task instances to clear", err=as_json)
        if as_json:
            click.echo(json.dumps({"tasks": [], "runs": {}}))
        return
    if not yes:
        rows = [c.as_dict() for c in found]
        click.echo(format_table(rows, ["run_id", "task_id", "state"]), err=as_json)
        click.confirm(f"Clear these {len(found)} task instance(s)?", abort=True, err=as_json)

    def clear(session: Session) -> actions.ActionResult:
        selected = select(session)  # again, in the writing transaction: states move on
        return actions.clear_task_instances(session, selected, now=utcnow())

    result: actions.ActionResult = run_query(ctx, clear, writes=True)
    _print_changes(result.tasks, result.runs, as_json)


@click.command("set-state")
@click.argument("dag_id")
@click.argument("run_id")
@click.argument("task_id")
@click.argument("state", type=click.Choice([str(s) for s in actions.SETTABLE_STATES]))
@click.option("-d", "--downstream", is_flag=True, help="Also its downstream tasks.")
@click.option("-u", "--upstream", is_flag=True, help="Also its upstream tasks.")
@click.option("--map-index", type=int, default=None, help="Only this copy of a mapped task.")
@json_option
@click.pass_context
def tasks_set_state(
    ctx: click.Context,
    dag_id: str,
    run_id: str,
    task_id: str,
    state: str,
    downstream: bool,
    upstream: bool,
    map_index: int | None,
    as_json: bool,
) -> None:
    """Mark a task instance success, failed or skipped (Airflow's mark success / failed).

    A running or deferred task is stopped (its trigger removed). Marking success records
    no outlet asset events and clears the failed tasks downstream of it so they run again;
    the scheduler re-evaluates the run (a finished run goes back to queued).
    """
    mark = partial(
        actions.set_task_state,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        state=state,
        downstream=downstream,
        upstream=upstream,
        map_index=map_index,
        now=utcnow(),
    )
    result: actions.ActionResult = run_query(ctx, mark, writes=True)
    _print_changes(result.tasks, result.runs, as_json)


@click.command("cancel")
@click.argument("dag_id")
@click.argument("run_id")
@json_option
@click.pass_context
def runs_cancel(ctx: click.Context, dag_id: str, run_id: str, as_json: bool) -> None:
    """Mark a queued or running run failed (Airflow's "mark run as failed").

    Running and deferred tasks become failed (their processes and triggers stopped);
    tasks not started, or waiting for a retry, become skipped.
    """
    cancel = partial(run_ends.cancel_run, dag_id=dag_id, run_id=run_id, now=utcnow())
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
