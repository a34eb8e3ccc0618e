"""``sluice tasks ...``: task instances: the log of a try (logs), what a task stored
(result: its XComs; state: its task state store), and the operator actions Airflow 3
calls clear and mark success / failed / skipped (clear, set-state, over
``engine.db.queries.actions``: these commands parse, confirm, and print what was done;
what still runs for a changed task, its process or its trigger, is stopped by the engine
within a heartbeat).
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from engine.authoring.timetables import timezone_of
from engine.cli.common import (
    emit,
    fail,
    format_table,
    get_config,
    json_option,
    parse_date,
    run_query,
)
from engine.db import models
from engine.db.queries import actions
from engine.db.queries import backfills as backfills_sql
from engine.db.queries import state_store as state_sql
from engine.task_log_files import read_task_log
from engine.views import tasks as tasks_view

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session


@click.group()
def tasks() -> None:
    """Task instances."""


map_index_option = click.option(
    "--map-index",
    type=int,
    default=-1,
    show_default=True,
    help="The copy of a mapped task (-1: an unmapped task).",
)


def _missing(
    ctx: click.Context, dag_id: str, run_id: str, task_id: str, map_index: int
) -> str | None:
    """None when the task instance exists, else why none matched (an unknown DAG fails)."""

    def look(session: Any) -> str | None:
        found = tasks_view.show_task_instance(
            session, dag_id, run_id, task_id, map_index, now=models.utcnow()
        )
        if found is not None:
            return None
        return tasks_view.missing_task_instance(session, dag_id, run_id, task_id, map_index)

    missing: str | None = run_query(ctx, look)
    return missing


@tasks.command("list")
@click.argument("dag_id")
@click.argument("run_id")
@click.option("--state", default=None, help="Only the task instances in this state.")
@json_option
@click.pass_context
def tasks_list(
    ctx: click.Context, dag_id: str, run_id: str, state: str | None, as_json: bool
) -> None:
    """The task instances of a run, in task order: a copy of a mapped task with its
    map_index and the name its map_index_template gave it (``name``)."""
    listed = run_query(
        ctx,
        lambda s: tasks_view.list_task_instances(
            s, dag_id, run_id, now=models.utcnow(), state=state
        ),
    )
    if listed is None:
        fail(f"no run {run_id!r} of DAG {dag_id!r}; see `sluice runs list {dag_id}`")
    rows = [
        {**ti, "map_index": ti["map_index"] if ti["map_index"] >= 0 else None}
        for ti in listed["items"]
    ]
    if not as_json:
        rows = [{**ti, "name": ti["rendered_map_index"]} for ti in rows]
    columns = ["task_id", "map_index", "name", "state", "try_number", "operator"]
    emit(rows, [*columns, "start_date", "duration_s"], as_json)


@tasks.command("logs")
@click.argument("dag_id")
@click.argument("run_id")
@click.argument("task_id")
@click.option("--try", "try_number", type=int, default=None, help="A given try (default: last).")
@map_index_option
@click.pass_context
def tasks_logs(
    ctx: click.Context,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int | None,
    map_index: int,
) -> None:
    """Print the log of a task's try (of one copy of a mapped task: ``--map-index``)."""
    missing = _missing(ctx, dag_id, run_id, task_id, map_index)
    if missing is not None:
        fail(missing)
    folder = get_config(ctx).logging.task_log_folder
    try:
        text = read_task_log(folder, dag_id, run_id, task_id, try_number, map_index=map_index)
        click.echo(text, nl=False)
    except FileNotFoundError as exc:
        fail(f"no log for that try yet: {exc}")


@tasks.command("result")
@click.argument("dag_id")
@click.argument("run_id")
@click.argument("task_id")
@click.option("--key", default=None, help="Only this result (default: every one).")
@map_index_option
@json_option
@click.pass_context
def tasks_result(
    ctx: click.Context,
    dag_id: str,
    run_id: str,
    task_id: str,
    key: str | None,
    map_index: int,
    as_json: bool,
) -> None:
    """Print the results (XComs) a task stored: its return value and what it pushed (of one
    copy of a mapped task: ``--map-index``).

    Each as ``key: JSON``; with ``--key`` only that value (a string as it is); ``--json``
    prints JSON (datetimes as ISO 8601 text, tuples and sets as lists).
    """

    def load(session: Any) -> tuple[tasks_view.TaskResultsShown | None, str]:
        found = tasks_view.task_results(session, dag_id, run_id, task_id, map_index, plain=False)
        if found is not None:
            return found, ""
        return None, tasks_view.missing_task_instance(session, dag_id, run_id, task_id, map_index)

    found, missing = run_query(ctx, load)
    if found is None:
        fail(missing)
    results: dict[str, Any] = found["results"]
    state: str = found["state"]
    if key is not None:
        if key not in results:
            fail(_missing_result(task_id, key, state, sorted(results)))
        value = results[key]
        plain = isinstance(value, str) and not as_json
        click.echo(value if plain else _result_json(value, indent=2 if as_json else None))
    elif as_json:
        shown: dict[str, Any] = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id}
        shown["state"] = state
        if map_index >= 0:
            shown["map_index"] = map_index
        click.echo(_result_json({**shown, "results": results}, indent=2))
    elif not results:
        click.echo(f"(none: {_no_results(state)})")
    else:
        for name, value in results.items():
            click.echo(f"{name}: {_result_json(value)}")


@tasks.command("state")
@click.argument("dag_id")
@click.argument("run_id")
@click.argument("task_id")
@map_index_option
@json_option
@click.pass_context
def tasks_state(
    ctx: click.Context, dag_id: str, run_id: str, task_id: str, map_index: int, as_json: bool
) -> None:
    """Print what a task instance keeps in its task state store (``task_state_store``): each
    key, its JSON value, when it was written and when ``sluice db clean`` may delete it
    (``-``: never)."""

    def load(session: Any) -> tuple[list[state_sql.StateEntry] | None, str]:
        found = state_sql.task_state_entries(
            session, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
        )
        if found is not None:
            return found, ""
        return None, tasks_view.missing_task_instance(session, dag_id, run_id, task_id, map_index)

    found, missing = run_query(ctx, load)
    if found is None:
        fail(missing)
    emit([state_row(entry) for entry in found], STATE_COLUMNS, as_json)


STATE_COLUMNS = ("key", "value", "updated_at", "expires_at")


def state_row(entry: state_sql.StateEntry) -> dict[str, Any]:
    """One state store entry as ``sluice tasks state`` / ``sluice assets state`` show it."""
    return {
        "key": entry.key,
        "value": entry.value,
        "updated_at": entry.updated_at.isoformat(),
        "expires_at": None if entry.expires_at is None else entry.expires_at.isoformat(),
    }


def _plain(value: Any) -> Any:
    """What ``json.dumps`` cannot write, as JSON: sets as lists, dates as ISO text, bytes and
    anything else as text."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _result_json(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(value, default=_plain, indent=indent)


def _no_results(state: str) -> str:
    if state == "success":
        return "the task returned None and pushed nothing"
    shown = "not started" if state == "none" else state
    return f"the task is {shown}; results are stored when it succeeds"


def _missing_result(task_id: str, key: str, state: str, keys: list[str]) -> str:
    if keys:
        return f"task {task_id!r} has no result {key!r}; it has {', '.join(keys)}"
    return f"task {task_id!r} has no result {key!r}: {_no_results(state)}"


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


@tasks.command("clear")
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
        return actions.clear_task_instances(session, selected, now=models.utcnow())

    result: actions.ActionResult = run_query(ctx, clear, writes=True)
    _print_changes(result.tasks, result.runs, as_json)


@tasks.command("set-state")
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
        now=models.utcnow(),
    )
    result: actions.ActionResult = run_query(ctx, mark, writes=True)
    _print_changes(result.tasks, result.runs, as_json)
