"""``sluice dags ...``: the DAGs found in the dags folder (list, errors, show), pausing and
unpausing them, a manual run (trigger), why one did not run (why; its text form is
``engine.cli.why_text``), and a backfill (``engine.cli.backfill``). Tables, or ``--json``.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from engine.authoring.timetables import timezone_of
from engine.cli import why_text
from engine.cli.backfill import dags_backfill
from engine.cli.common import (
    emit,
    fail,
    format_cell,
    format_table,
    get_config,
    json_option,
    parse_date,
    parse_json_object,
    run_query,
)
from engine.db import models
from engine.db.queries import dags as dags_sql
from engine.views import dags as dags_view
from engine.views import operations
from engine.views.common import iso
from engine.views.why import UnknownDagError, explain_dag

if TYPE_CHECKING:
    from engine.db.queries.backfills import DagSchedule


@click.group()
def dags() -> None:
    """DAGs: list, show, errors, pause, unpause, trigger."""


dags.add_command(dags_backfill)


@dags.command("list")
@json_option
@click.pass_context
def dags_list(ctx: click.Context, as_json: bool) -> None:
    """The DAGs found in the dags folder: schedule, next time run, tags."""
    listed = run_query(ctx, dags_view.list_dags)["items"]
    out = []
    for item in listed:
        row = {k: item[k] for k in ("dag_id", "fileloc", "paused", "active")}
        if as_json:
            schedule = {k: item[k] for k in dags_view.SCHEDULE_KEYS}
            out.append({**row, "schedule": item["asset_condition"], **schedule})
        else:
            tags = ", ".join(item["tags"]) or None
            extra = {"schedule": item["schedule"], "next_run": item["next_run"], "tags": tags}
            out.append({**row, **extra})
    emit(out, ["dag_id", "paused", "active", "schedule", "next_run", "tags", "fileloc"], as_json)


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
        click.echo(f"{where}: {without_location(row['error'], row['file'], row['line'])}")


def without_location(error: str, fileloc: str, line: int | None) -> str:
    """A stored parse error (``Type: message``) without the place its line already starts
    with: a ``DagDefinitionError``'s message opens with ``file:line:``, a ``SyntaxError``'s
    ends with ``(name.py, line N)``; a place elsewhere (another file or line) stays."""
    kind, sep, message = error.partition(": ")
    if not sep:
        return error
    here = [f"{fileloc}:{line}: ", f"{fileloc}: "] if line is not None else [f"{fileloc}: "]
    for prefix in here:
        message = message.removeprefix(prefix)
    if line is not None:
        message = message.removesuffix(f" ({Path(fileloc).name}, line {line})")
    return f"{kind}{sep}{message}"


@dags.command("show")
@click.argument("dag_id")
@json_option
@click.pass_context
def dags_show(ctx: click.Context, dag_id: str, as_json: bool) -> None:
    """One DAG: file, schedule, tasks, the watchers of its assets, paused state, last runs."""

    shown, sched = run_query(
        ctx, lambda s: (dags_view.show_dag(s, dag_id), dags_view.dag_schedule(s, dag_id))
    )
    if shown is None or sched is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    if as_json:
        printed = {k: v for k, v in shown.items() if k not in _SHOW_JSON_LEFT_OUT}
        click.echo(json.dumps(printed, indent=2, default=str))
        return
    for key in ("dag_id", "fileloc", "description", "paused", "active", "last_parsed"):
        _show_line(key, format_cell(shown[key]))
    for key, value in _schedule_lines(sched):
        _show_line(key, value)
    _show_line("assets", ", ".join(shown["assets"]) or "-")
    _show_line("deadlines", "; ".join(shown["deadline_alerts"]) or "-")
    for title, columns in _SHOW_SECTIONS:
        click.echo(f"\n{title}:")
        rows = shown[title.replace(" ", "_")]
        click.echo(_indent(format_table(rows, columns)) if rows else "  (none)")


#: What ``dags show --json`` leaves out of the view (the table shows them otherwise).
_SHOW_JSON_LEFT_OUT = frozenset({"schedule_text", "run_counts"})


def _show_line(key: str, value: str) -> None:
    click.echo(f"{key + ':':<17}{value}")


def _schedule_lines(sched: DagSchedule) -> list[tuple[str, str]]:
    """``dags show``: the schedule, its time bounds and limits, and the next time run."""
    description = dags_view.timetable_description(sched)
    lines = [
        ("schedule", dags_view.schedule_text(sched, description=description)),
        ("timezone", sched.timezone),
        ("start_date", format_cell(iso(sched.start_date))),
        ("end_date", format_cell(iso(sched.end_date))),
        ("catchup", str(sched.catchup)),
        ("max_active_runs", str(sched.max_active_runs)),
        ("tags", ", ".join(sched.tags) or "-"),
        ("next run", dags_view.next_run_text(sched)),
    ]
    if sched.next_dagrun is not None and sched.timetable is not None and not sched.is_paused:
        interval = sched.next_dagrun_data_interval
        if interval is not None:
            lines.append(
                ("  data interval", f"{interval[0].isoformat()} .. {interval[1].isoformat()}")
            )
        lines.append(("  created after", format_cell(iso(sched.next_dagrun_create_after))))
    return lines


_SHOW_SECTIONS = (
    (
        "tasks",
        [
            "task_id",
            "operator",
            "downstream",
            "retries",
            "start_from_trigger",
            "outlets",
            "mapped",
            "role",
            "edge_labels",
        ],
    ),
    ("watchers", ["asset", "name", "trigger_id", "classpath", "triggerer_id", "last_error"]),
    (
        "last runs",
        ["run_id", "run_type", "state", "logical_date", "partition_key", "queued_at", "end_date"],
    ),
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
@click.option(
    "--logical-date",
    "logical_text",
    default=None,
    metavar="DATE",
    help="The run's logical date (default: now); without an offset, in the DAG's timezone.",
)
@click.option(
    "--partition-key",
    default=None,
    metavar="KEY",
    help="The slice the run processes (any DAG; at most 250 characters).",
)
@json_option
@click.pass_context
def dags_trigger(
    ctx: click.Context,
    dag_id: str,
    conf: str | None,
    logical_text: str | None,
    partition_key: str | None,
    as_json: bool,
) -> None:
    """Create a manual run of a DAG now; prints its run id.

    Its data interval is the one the DAG's time schedule gives its logical date (none: the
    logical date itself). A run with a future logical date waits for it.
    """
    parsed = parse_json_object(conf, "--conf")
    sched = run_query(ctx, lambda s: dags_view.dag_schedule(s, dag_id))
    if sched is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    now = models.utcnow()
    logical_date = now
    if logical_text is not None:
        zone = timezone_of(sched.timezone)
        logical_date = parse_date(logical_text, timezone=zone, option="--logical-date")

    def trigger(session: Any) -> operations.TriggeredRun:
        return operations.trigger_dag(
            session,
            dag_id,
            conf=parsed,
            logical_date=logical_date,
            now=now,
            partition_key=partition_key,
        )

    run_id = run_query(ctx, trigger, writes=True)["run_id"]
    if as_json:
        triggered = {"dag_id": dag_id, "run_id": run_id, "logical_date": logical_date.isoformat()}
        if partition_key is not None:
            triggered["partition_key"] = partition_key
        click.echo(json.dumps(triggered))
    else:
        key = "" if partition_key is None else f" (partition {partition_key})"
        click.echo(f"triggered a manual run of {dag_id}{key}: {run_id}")


@dags.command("why")
@click.argument("dag_id")
@json_option
@click.pass_context
def dags_why(ctx: click.Context, dag_id: str, as_json: bool) -> None:
    """Why DAG_ID did not run: schedule, asset events still missing, watchers, triggerers."""
    cfg = get_config(ctx)
    explain = partial(
        explain_dag,
        dag_id=dag_id,
        now=models.utcnow(),
        triggerer_threshold_s=cfg.triggerer.health_check_threshold_s,
        scheduler_threshold_s=cfg.scheduler.health_check_threshold_s,
    )
    try:
        view = run_query(ctx, explain)
    except UnknownDagError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(view, indent=2))
    else:
        click.echo(why_text.render_text(view), nl=False)
