"""Inspection commands: ``sluice dags|runs|assets|tasks ...`` (tables, or ``--json``).

The workflow nouns: DAGs (list, errors, show, pause, unpause, trigger), their runs, the
assets and their events, and the logs of task instances.
"""

from __future__ import annotations

import json
from typing import Any

import click

from engine.cli.common import (
    emit,
    fail,
    format_cell,
    format_table,
    get_config,
    json_option,
    run_query,
)
from engine.db import models
from engine.db.queries import assets as assets_sql
from engine.db.queries import dags as dags_sql
from engine.db.queries import inspection
from engine.db.queries import runs as runs_sql


@click.group()
def dags() -> None:
    """DAGs: list, show, errors, pause, unpause, trigger."""


@dags.command("list")
@json_option
@click.pass_context
def dags_list(ctx: click.Context, as_json: bool) -> None:
    """The DAGs found in the dags folder."""
    rows = run_query(ctx, dags_sql.list_dags)
    emit(rows, ["dag_id", "paused", "active", "fileloc"], as_json)


@dags.command("errors")
@json_option
@click.pass_context
def dags_errors(ctx: click.Context, as_json: bool) -> None:
    """DAG files that failed to parse, with file and line."""
    rows = [
        {"file": e.fileloc, "line": e.lineno, "error": e.error, "at": e.timestamp.isoformat()}
        for e in run_query(ctx, dags_sql.list_parse_errors)
    ]
    if as_json or not rows:
        emit(rows, ["file", "line", "error"], as_json)
        return
    for row in rows:
        where = row["file"] if row["line"] is None else f"{row['file']}:{row['line']}"
        click.echo(f"{where}: {row['error']}")


@dags.command("show")
@click.argument("dag_id")
@json_option
@click.pass_context
def dags_show(ctx: click.Context, dag_id: str, as_json: bool) -> None:
    """One DAG: file, schedule, tasks, the watchers of its assets, paused state, last runs."""

    details = run_query(ctx, lambda s: inspection.dag_details(s, dag_id))
    if details is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    if as_json:
        click.echo(json.dumps(details, indent=2, default=str))
        return
    for key in ("dag_id", "fileloc", "description", "paused", "active", "last_parsed"):
        click.echo(f"{key + ':':<13}{format_cell(details[key])}")
    click.echo(f"{'schedule:':<13}{format_cell(details['schedule'])}")
    click.echo(f"{'assets:':<13}{', '.join(details['assets']) or '-'}")
    for title, columns in _SHOW_SECTIONS:
        click.echo(f"\n{title}:")
        rows = details[title.replace(" ", "_")]
        click.echo(_indent(format_table(rows, columns)) if rows else "  (none)")


_SHOW_SECTIONS = (
    ("tasks", ["task_id", "operator", "downstream", "retries", "start_from_trigger"]),
    ("watchers", ["asset", "name", "trigger_id", "classpath", "triggerer_id", "last_error"]),
    ("last runs", ["run_id", "run_type", "state", "queued_at", "end_date"]),
)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _set_paused(ctx: click.Context, dag_id: str, *, paused: bool) -> None:
    if not run_query(ctx, lambda s: dags_sql.set_paused(s, dag_id, paused=paused), writes=True):
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    click.echo(f"{dag_id} {'paused' if paused else 'unpaused'}")


@dags.command("pause")
@click.argument("dag_id")
@click.pass_context
def dags_pause(ctx: click.Context, dag_id: str) -> None:
    """Pause a DAG (by default its asset events are kept and run it on unpause)."""
    _set_paused(ctx, dag_id, paused=True)


@dags.command("unpause")
@click.argument("dag_id")
@click.pass_context
def dags_unpause(ctx: click.Context, dag_id: str) -> None:
    """Unpause a DAG."""
    _set_paused(ctx, dag_id, paused=False)


@dags.command("trigger")
@click.argument("dag_id")
@click.option("--conf", default=None, help="JSON object passed to the run.")
@json_option
@click.pass_context
def dags_trigger(ctx: click.Context, dag_id: str, conf: str | None, as_json: bool) -> None:
    """Create a manual run of a DAG now; prints its run id."""
    try:
        parsed = json.loads(conf) if conf else None
    except json.JSONDecodeError as exc:
        fail(f"--conf is not JSON: {exc}")

    def trigger(session: Any) -> str | None:
        if not dags_sql.dag_exists(session, dag_id):
            return None
        pk = runs_sql.create_run(
            session, dag_id, run_type=runs_sql.MANUAL, now=models.utcnow(), conf=parsed
        )
        return runs_sql.run_id_of(session, pk)

    run_id = run_query(ctx, trigger, writes=True)
    if run_id is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    if as_json:
        click.echo(json.dumps({"dag_id": dag_id, "run_id": run_id}))
    else:
        click.echo(f"triggered a manual run of {dag_id}: {run_id}")


@click.group()
def runs() -> None:
    """DAG runs."""


@runs.command("list")
@click.argument("dag_id")
@json_option
@click.pass_context
def runs_list(ctx: click.Context, dag_id: str, as_json: bool) -> None:
    """The runs of a DAG with their state, tasks and triggering asset events."""
    rows = run_query(ctx, lambda s: runs_sql.list_runs(s, dag_id))
    emit(rows, ["run_id", "run_type", "state", "tasks", "asset_events"], as_json)


@click.group()
def assets() -> None:
    """Assets and their events."""


@assets.command("list")
@json_option
@click.pass_context
def assets_list(ctx: click.Context, as_json: bool) -> None:
    """Every asset with its number of events."""
    emit(run_query(ctx, assets_sql.list_assets), ["name", "uri", "events"], as_json)


@assets.command("events")
@click.argument("asset")
@json_option
@click.pass_context
def assets_events(ctx: click.Context, asset: str, as_json: bool) -> None:
    """The events of an asset: payload, source watcher, the runs they created."""
    rows = run_query(ctx, lambda s: assets_sql.list_asset_events(s, asset))
    if rows is None:
        fail(f"no asset {asset!r}; see `sluice assets list`")
    emit(rows, ["id", "timestamp", "source_watcher", "payload", "runs"], as_json)


@click.group()
def tasks() -> None:
    """Task instances."""


@tasks.command("logs")
@click.argument("dag_id")
@click.argument("run_id")
@click.argument("task_id")
@click.option("--try", "try_number", type=int, default=None, help="A given try (default: last).")
@click.pass_context
def tasks_logs(
    ctx: click.Context, dag_id: str, run_id: str, task_id: str, try_number: int | None
) -> None:
    """Print the log of a task's try."""
    from engine.executor.task_logs import read_task_log

    ti = run_query(ctx, lambda s: runs_sql.find_task_instance(s, dag_id, run_id, task_id))
    if ti is None:
        fail(f"no task {task_id!r} in run {run_id!r} of DAG {dag_id!r}")
    folder = get_config(ctx).logging.task_log_folder
    try:
        click.echo(read_task_log(folder, dag_id, run_id, task_id, try_number), nl=False)
    except FileNotFoundError as exc:
        fail(f"no log for that try yet: {exc}")
