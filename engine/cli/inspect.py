"""Inspection commands: ``sluice dags|runs|assets|tasks ...`` (tables, or ``--json``).

The workflow nouns: DAGs (list, errors, show, pause, unpause, trigger, and backfill from
``engine.cli.backfill``), their runs, the assets and their events (list, events, emit), and
the logs and results of task instances.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from engine.authoring.assets import ASSET_ALIAS_TYPE, ASSET_ALL_TYPE, ASSET_ANY_TYPE, ASSET_TYPE
from engine.authoring.timetables import DataInterval, timetable_from_json, timezone_of
from engine.cli.backfill import (
    cli_actor,
    dags_backfill,
    parse_date,
    parse_json_object,
    stored_timetable,
)
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
from engine.db.queries import backfills as backfills_sql
from engine.db.queries import dags as dags_sql
from engine.db.queries import inspection
from engine.db.queries import mapping as mapping_sql
from engine.db.queries import runs as runs_sql
from engine.db.queries import tasks as tasks_sql
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from datetime import datetime

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
    rows, schedules = run_query(
        ctx, lambda s: (dags_sql.list_dags(s), backfills_sql.dag_schedules(s))
    )
    out = []
    for row in rows:
        sched = schedules[row["dag_id"]]
        if as_json:
            out.append({**row, **_schedule_json(sched)})
        else:
            tags = ", ".join(sched.tags) or None
            out.append(
                {
                    **row,
                    "schedule": _schedule_text(sched),
                    "next_run": _next_run(sched),
                    "tags": tags,
                }
            )
    emit(out, ["dag_id", "paused", "active", "schedule", "next_run", "tags", "fileloc"], as_json)


def _condition_text(data: Any, *, nested: bool = False) -> str:
    """An asset condition's JSON as ``a & (b | alias c)``."""
    kind = data.get("__type") if isinstance(data, dict) else None
    if kind == ASSET_TYPE:
        return str(data["name"])
    if kind == ASSET_ALIAS_TYPE:
        return f"alias {data['name']}"
    if kind in (ASSET_ALL_TYPE, ASSET_ANY_TYPE):
        sep = " & " if kind == ASSET_ALL_TYPE else " | "
        text = sep.join(_condition_text(o, nested=True) for o in data.get("objects") or [])
        return f"({text})" if nested else text
    return json.dumps(data, default=str)


def _schedule_text(sched: DagSchedule, *, description: str | None = None) -> str:
    """The schedule in one line: the timetable's summary (and description) and/or the asset
    condition."""
    parts = []
    if sched.timetable is not None:
        summary = sched.timetable_summary or "timetable"
        parts.append(summary if description is None else f"{summary} ({description})")
    if sched.asset_condition is not None:
        parts.append(f"assets {_condition_text(sched.asset_condition)}")
    return " or ".join(parts) or "None"


def _next_run(sched: DagSchedule) -> str:
    """The next time run's logical date, or why there is none."""
    if sched.timetable is None:
        return "none"
    if sched.is_paused:
        return "paused"
    if not sched.next_dagrun_computed:
        return "not computed yet"
    if sched.next_dagrun is None:
        return "none"
    return sched.next_dagrun.isoformat()


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _schedule_json(sched: DagSchedule) -> dict[str, Any]:
    interval = sched.next_dagrun_data_interval
    return {
        "timetable": sched.timetable_summary if sched.timetable is not None else None,
        "timezone": sched.timezone,
        "start_date": _iso(sched.start_date),
        "end_date": _iso(sched.end_date),
        "catchup": sched.catchup,
        "max_active_runs": sched.max_active_runs,
        "tags": sched.tags,
        "next_run": _next_run(sched),
        "next_dagrun": _iso(sched.next_dagrun),
        "next_dagrun_data_interval": None if interval is None else [_iso(d) for d in interval],
        "next_dagrun_create_after": _iso(sched.next_dagrun_create_after),
    }


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

    details, schedules = run_query(
        ctx,
        lambda s: (inspection.dag_details(s, dag_id), backfills_sql.dag_schedules(s, [dag_id])),
    )
    if details is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    sched = schedules[dag_id]
    if as_json:
        timetable = _timetable_json(sched)
        shown = {**details, **_schedule_json(sched), "timetable": timetable}
        click.echo(json.dumps(shown, indent=2, default=str))
        return
    for key in ("dag_id", "fileloc", "description", "paused", "active", "last_parsed"):
        _show_line(key, format_cell(details[key]))
    for key, value in _schedule_lines(sched):
        _show_line(key, value)
    _show_line("assets", ", ".join(details["assets"]) or "-")
    for title, columns in _SHOW_SECTIONS:
        click.echo(f"\n{title}:")
        rows = details[title.replace(" ", "_")]
        click.echo(_indent(format_table(rows, columns)) if rows else "  (none)")


def _show_line(key: str, value: str) -> None:
    click.echo(f"{key + ':':<17}{value}")


def _description(sched: DagSchedule) -> str | None:
    """The timetable's sentence; a stored timetable this version cannot read says so (the
    rest of ``dags show`` is still worth printing)."""
    if sched.timetable is None:
        return None
    try:
        return timetable_from_json(sched.timetable).description
    except ValueError as exc:
        return f"unreadable stored timetable: {exc}"


def _timetable_json(sched: DagSchedule) -> dict[str, Any] | None:
    if sched.timetable is None:
        return None
    return {
        "summary": sched.timetable_summary,
        "description": _description(sched),
        "serialized": sched.timetable,
    }


def _schedule_lines(sched: DagSchedule) -> list[tuple[str, str]]:
    """``dags show``: the schedule, its time bounds and limits, and the next time run."""
    lines = [
        ("schedule", _schedule_text(sched, description=_description(sched))),
        ("timezone", sched.timezone),
        ("start_date", format_cell(_iso(sched.start_date))),
        ("end_date", format_cell(_iso(sched.end_date))),
        ("catchup", str(sched.catchup)),
        ("max_active_runs", str(sched.max_active_runs)),
        ("tags", ", ".join(sched.tags) or "-"),
        ("next run", _next_run(sched)),
    ]
    if sched.next_dagrun is not None and sched.timetable is not None and not sched.is_paused:
        interval = sched.next_dagrun_data_interval
        if interval is not None:
            lines.append(
                ("  data interval", f"{interval[0].isoformat()} .. {interval[1].isoformat()}")
            )
        lines.append(("  created after", format_cell(_iso(sched.next_dagrun_create_after))))
    return lines


_SHOW_SECTIONS = (
    (
        "tasks",
        ["task_id", "operator", "downstream", "retries", "start_from_trigger", "outlets", "mapped"],
    ),
    ("watchers", ["asset", "name", "trigger_id", "classpath", "triggerer_id", "last_error"]),
    ("last runs", ["run_id", "run_type", "state", "logical_date", "queued_at", "end_date"]),
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
@json_option
@click.pass_context
def dags_trigger(
    ctx: click.Context, dag_id: str, conf: str | None, logical_text: str | None, as_json: bool
) -> None:
    """Create a manual run of a DAG now; prints its run id.

    Its data interval is the one the DAG's time schedule gives its logical date (none: the
    logical date itself). A run with a future logical date waits for it.
    """
    parsed = parse_json_object(conf, "--conf")
    sched = run_query(ctx, lambda s: backfills_sql.dag_schedules(s, [dag_id])).get(dag_id)
    if sched is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    now = models.utcnow()
    logical_date = now
    if logical_text is not None:
        zone = timezone_of(sched.timezone)
        logical_date = parse_date(logical_text, timezone=zone, option="--logical-date")
    interval = DataInterval(logical_date, logical_date)
    if sched.timetable is not None:
        timetable = stored_timetable(dag_id, sched.timetable)
        interval = timetable.infer_manual_data_interval(run_after=logical_date)

    def trigger(session: Any) -> str | None:
        pk = runs_sql.create_run(
            session,
            dag_id,
            run_type=runs_sql.MANUAL,
            now=now,
            conf=parsed,
            logical_date=logical_date,
            data_interval=(interval.start, interval.end),
            run_after=max(now, logical_date),
        )
        return None if pk is None else runs_sql.run_id_of(session, pk)

    run_id = run_query(ctx, trigger, writes=True)
    if run_id is None:
        fail(
            f"DAG {dag_id!r} already has a run with logical date {logical_date.isoformat()}; "
            "`sluice runs list` shows it, --logical-date picks another"
        )
    if as_json:
        click.echo(
            json.dumps(
                {"dag_id": dag_id, "run_id": run_id, "logical_date": logical_date.isoformat()}
            )
        )
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
    if not rows:
        _require_dag(ctx, dag_id)
    columns = ["run_id", "run_type", "state", "logical_date", "run_after", "tasks", "asset_events"]
    emit(rows, columns, as_json)


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
    """The events of an asset: where they came from, extra and payload, the runs they
    created."""
    rows = run_query(ctx, lambda s: assets_sql.list_asset_events(s, asset))
    if rows is None:
        fail(f"no asset {asset!r}; see `sluice assets list`")
    columns = ["id", "timestamp", "source", "source_watcher", "source_task", "created_by"]
    emit(rows, [*columns, "extra", "payload", "runs"], as_json)


@assets.command("emit")
@click.argument("asset")
@click.option("--extra", default=None, metavar="JSON", help="JSON object: the event's extra.")
@json_option
@click.pass_context
def assets_emit(ctx: click.Context, asset: str, extra: str | None, as_json: bool) -> None:
    """Record an event of ASSET, as a watcher would: the DAGs scheduled on it run. Prints the
    event's id."""
    parsed = parse_json_object(extra, "--extra")
    keep = get_config(ctx).scheduler.keep_events_while_paused
    actor = cli_actor()

    def emit_event(session: Any) -> int:
        return assets_sql.emit_asset_event(
            session,
            asset,
            extra=parsed,
            source=assets_sql.SOURCE_CLI,
            created_by=actor,
            keep_while_paused=keep,
        )

    try:
        event_id = run_query(ctx, emit_event, writes=True)
    except assets_sql.UnknownAssetError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps({"asset": asset, "event_id": event_id}))
    else:
        click.echo(f"emitted event {event_id} of asset {asset}")


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


def _require_dag(ctx: click.Context, dag_id: str) -> None:
    """Fail (exit 1) when no DAG has this id: an unknown DAG is not an empty answer."""
    if not run_query(ctx, lambda s: dags_sql.dag_exists(s, dag_id)):
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")


def _no_task_instance(
    ctx: click.Context, dag_id: str, run_id: str, task_id: str, map_index: int
) -> str:
    """Why no task instance matched, with the map indexes of a mapped task."""
    _require_dag(ctx, dag_id)
    indexes = run_query(ctx, lambda s: mapping_sql.map_indexes(s, dag_id, run_id, task_id))
    if indexes and map_index not in indexes:
        return (
            f"task {task_id!r} of run {run_id!r} (DAG {dag_id!r}) is mapped: pass --map-index "
            f"{indexes[0]}..{indexes[-1]}"
        )
    copy = f" map_index {map_index}" if map_index >= 0 else ""
    return f"no task {task_id!r}{copy} in run {run_id!r} of DAG {dag_id!r}; see `sluice runs list`"


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
    from engine.executor.task_logs import read_task_log

    ti = run_query(
        ctx, lambda s: runs_sql.find_task_instance(s, dag_id, run_id, task_id, map_index)
    )
    if ti is None:
        fail(_no_task_instance(ctx, dag_id, run_id, task_id, map_index))
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
    found = run_query(
        ctx, lambda s: tasks_sql.load_task_results(s, dag_id, run_id, task_id, map_index)
    )
    if found is None:
        fail(_no_task_instance(ctx, dag_id, run_id, task_id, map_index))
    results = {name: _stored_value(value) for name, value in _ordered(found.xcoms)}
    if key is not None:
        if key not in results:
            fail(_missing_result(task_id, key, found.state, sorted(results)))
        value = results[key]
        plain = isinstance(value, str) and not as_json
        click.echo(value if plain else _result_json(value, indent=2 if as_json else None))
    elif as_json:
        shown = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "state": found.state}
        if map_index >= 0:
            shown["map_index"] = map_index
        click.echo(_result_json({**shown, "results": results}, indent=2))
    elif not results:
        click.echo(f"(none: {_no_results(found.state)})")
    else:
        for name, value in results.items():
            click.echo(f"{name}: {_result_json(value)}")


def _ordered(xcoms: dict[str, Any]) -> list[tuple[str, Any]]:
    """``return_value`` first, then the other keys by name."""
    return sorted(xcoms.items(), key=lambda item: (item[0] != "return_value", item[0]))


def _stored_value(value: Any) -> Any:
    """A stored result decoded; one this version cannot decode is shown as stored."""
    try:
        return deserialize_value(value)
    except SerializationError:
        return value


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
