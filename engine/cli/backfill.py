"""``sluice dags backfill``: the runs of a DAG's time schedule between two dates, or of a
partitioned DAG's keys (``--partitions K1,K2``: ``engine.cli.partition_backfill``).

The logical dates come from the DAG's stored timetable (a ``CronPartitionTimetable`` gives
each its partition key, and a key that already has a run is not run again); the runs are
written in batches (``engine.scheduler.backfills``), each in its own transaction, so a
killed command leaves whole batches behind and the same command run again resumes without
duplicates. The
scheduler admits the runs, at most ``--max-active-runs`` at once, and completes the backfill
when they have all ended.

``engine.cli.dags`` adds the command to the ``dags`` group.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import TimeRestriction, Timetable, timezone_of
from engine.cli.common import (
    cli_actor,
    fail,
    format_table,
    json_option,
    open_database,
    parse_date,
    run_query,
)
from engine.cli.partition_backfill import PartitionKeysError, partition_targets
from engine.db.models import utcnow
from engine.db.queries import backfills
from engine.exceptions import SluiceError
from engine.scheduler import backfills as backfill_rules
from engine.scheduler.backfills import PartitionTarget

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.authoring.timetables import DagRunInfo
    from engine.db.database import Database


def stored_timetable(dag_id: str, data: object) -> Timetable:
    """The DAG's stored timetable; a row this version cannot read fails the command."""
    try:
        return timetable_from_json(data)
    except ValueError as exc:
        fail(
            f"the stored schedule of DAG {dag_id!r} cannot be read ({exc}); let the DAG "
            "processor parse the DAG file again"
        )


@dataclass(frozen=True, slots=True)
class BackfillResult:
    backfill_id: int
    resumed: bool
    created: int
    reprocessed: int
    skipped: int
    completed: bool  # nothing left to run (every date was skipped)


def write_backfill(
    db: Database,
    dag_id: str,
    infos: Sequence[DagRunInfo] | Sequence[PartitionTarget],
    *,
    from_date: datetime | None,
    to_date: datetime | None,
    reprocess: str,
    max_active_runs: int,
    created_by: str | None,
    batch_size: int = backfill_rules.BACKFILL_BATCH_SIZE,
    clock: Callable[[], datetime] = utcnow,
    timetable: Timetable | None = None,
    partition_keys: Sequence[str] | None = None,
) -> BackfillResult:
    """Create (or resume) the backfill, then its runs, ``batch_size`` per transaction.

    ``infos`` are the logical dates' ticks, or a ``PartitionedAtRuntime`` backfill's keys
    (``PartitionTarget``s, with no dates). ``timetable`` gives each tick its partition key
    (a ``CronPartitionTimetable``). ``partition_keys``: the keys a ``--partitions`` backfill
    was asked for (it is resumed by them, not by dates). Raises ``BackfillConflictError``
    when the DAG has an unfinished backfill of another range (or other keys).
    """
    keys = partition_keys

    def start(session: Any) -> tuple[int, bool]:
        before = backfills.unfinished_backfill(session, dag_id)
        backfill_id = backfills.create_or_resume_backfill(
            session,
            dag_id,
            from_date=from_date,
            to_date=to_date,
            reprocess=reprocess,
            max_active_runs=max_active_runs,
            created_by=created_by,
            now=clock(),
            partition_keys=keys,
        )
        return backfill_id, before is not None and before.id == backfill_id

    backfill_id, resumed = db.call(start)
    counts = {"created": 0, "reprocessed": 0, "skipped": 0}
    for first in range(0, len(infos), batch_size):
        batch = infos[first : first + batch_size]
        add = partial(_add_batch, backfill_id, batch, reprocess, clock, timetable)
        done = db.call(add)
        for key, value in done.items():
            counts[key] += value
    completed = False
    if counts["created"] == counts["reprocessed"] == 0:
        completed = db.call(
            lambda s: backfills.complete_backfill_if_done(s, backfill_id, now=clock())
        )
    return BackfillResult(backfill_id, resumed, completed=completed, **counts)


def _add_batch(
    backfill_id: int,
    batch: Sequence[DagRunInfo] | Sequence[PartitionTarget],
    reprocess: str,
    clock: Callable[[], datetime],
    timetable: Timetable | None,
    session: Session,
) -> dict[str, int]:
    targets = [t for t in batch if isinstance(t, PartitionTarget)]
    if targets:
        return backfill_rules.add_partition_backfill_runs(
            session, backfill_id, targets, reprocess=reprocess, now=clock()
        )
    infos = [t for t in batch if not isinstance(t, PartitionTarget)]
    return backfill_rules.add_backfill_runs(
        session, backfill_id, infos, reprocess=reprocess, now=clock(), timetable=timetable
    )


@click.command("backfill")
@click.argument("dag_id")
@click.option("--from", "from_text", default=None, metavar="DATE", help="First logical date.")
@click.option("--to", "to_text", default=None, metavar="DATE", help="Last logical date.")
@click.option(
    "--partitions",
    "partitions_text",
    default=None,
    metavar="K1,K2",
    help="A partitioned DAG's keys instead of dates: one run per key.",
)
@click.option(
    "--max-active-runs",
    type=click.IntRange(min=1),
    default=None,
    help="Runs of the backfill at once (default: the DAG's max_active_runs).",
)
@click.option(
    "--reprocess",
    type=click.Choice(backfills.REPROCESS_BEHAVIORS),
    default=backfills.REPROCESS_NONE,
    show_default=True,
    help="Dates that already have a finished run: run the failed, all, or none again.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be done; write nothing.")
@json_option
@click.pass_context
def dags_backfill(
    ctx: click.Context,
    dag_id: str,
    from_text: str | None,
    to_text: str | None,
    partitions_text: str | None,
    max_active_runs: int | None,
    reprocess: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Run a DAG for every logical date of its schedule from --from to --to (both included),
    or, --partitions, once for each partition key of a partitioned DAG.

    DATE is an ISO date or datetime; without an offset it is in the DAG's timezone. Queued
    and running runs are left alone; --reprocess decides about finished ones.
    """
    if partitions_text is not None and (from_text is not None or to_text is not None):
        fail("give either --partitions or --from/--to, not both")
    if partitions_text is None and (from_text is None or to_text is None):
        fail("give --from and --to (the dates to run), or --partitions (the keys to run)")
    schedule = _backfill_schedule(ctx, dag_id)
    timetable = stored_timetable(dag_id, schedule.timetable)
    limit = max_active_runs or schedule.max_active_runs
    if partitions_text is not None:
        request = _PartitionRequest(partitions_text, reprocess, limit, dry_run, as_json)
        _backfill_partitions(ctx, schedule, timetable, request)
        return
    assert from_text is not None and to_text is not None
    timezone = timezone_of(schedule.timezone)
    from_date = parse_date(from_text, timezone=timezone, option="--from")
    to_date = parse_date(to_text, timezone=timezone, option="--to")
    if from_date > to_date:
        fail(f"--from {from_date.isoformat()} is after --to {to_date.isoformat()}")
    restriction = TimeRestriction(
        earliest=schedule.start_date, latest=schedule.end_date, catchup=schedule.catchup
    )
    infos = timetable.runs_between(from_date, to_date, restriction=restriction)
    if not infos:
        fail(_no_dates(schedule, from_date, to_date))
    summary = {
        "dag_id": dag_id,
        "from": from_date.isoformat(),
        "to": to_date.isoformat(),
        "logical_dates": len(infos),
        "max_active_runs": limit,
        "reprocess": reprocess,
        "dry_run": dry_run,
    }
    if dry_run:
        plan = run_query(
            ctx, lambda s: backfill_rules.backfill_plan(s, dag_id, infos, reprocess=reprocess)
        )
        _print_plan(summary, plan, as_json)
        return
    result = _write(ctx, dag_id, infos, (from_date, to_date), reprocess, limit, timetable)
    _print_result(summary, result, as_json)
    if schedule.is_paused and not as_json:
        click.echo(
            f"DAG {dag_id} is paused: its backfill runs wait until `sluice dags unpause {dag_id}`"
        )


def _backfill_schedule(ctx: click.Context, dag_id: str) -> backfills.DagSchedule:
    schedule: backfills.DagSchedule | None = run_query(
        ctx, lambda s: backfills.dag_schedules(s, [dag_id])
    ).get(dag_id)
    if schedule is None:
        fail(f"no DAG {dag_id!r}; see `sluice dags list`")
    if not schedule.is_active:
        fail(f"DAG {dag_id!r} is no longer defined by a DAG file; nothing to backfill")
    if schedule.timetable is None:
        kind = "asset events" if schedule.asset_condition is not None else "manual runs only"
        fail(
            f"DAG {dag_id!r} has no time schedule ({kind}); a backfill needs logical dates "
            "from a cron, timedelta or timetable schedule"
        )
    return schedule


def _no_dates(schedule: backfills.DagSchedule, from_date: datetime, to_date: datetime) -> str:
    bounds = ", ".join(
        f"{name} {value.isoformat()}"
        for name, value in (("start_date", schedule.start_date), ("end_date", schedule.end_date))
        if value is not None
    )
    return (
        f"the schedule of DAG {schedule.dag_id!r} ({schedule.timetable_summary}) has no "
        f"logical date from {from_date.isoformat()} to {to_date.isoformat()}"
        + (f" within its {bounds}" if bounds else "")
    )


def _write(
    ctx: click.Context,
    dag_id: str,
    infos: Sequence[DagRunInfo] | Sequence[PartitionTarget],
    dates: tuple[datetime | None, datetime | None],
    reprocess: str,
    limit: int,
    timetable: Timetable,
    partition_keys: Sequence[str] | None = None,
) -> BackfillResult:
    db = open_database(ctx)
    try:
        return write_backfill(
            db,
            dag_id,
            infos,
            from_date=dates[0],
            to_date=dates[1],
            reprocess=reprocess,
            max_active_runs=limit,
            created_by=cli_actor(),
            timetable=timetable,
            partition_keys=partition_keys,
        )
    except backfills.BackfillConflictError as exc:
        fail(str(exc))
    except SluiceError as exc:
        fail(
            f"{str(exc).strip().splitlines()[0]} (database {db!r}); the runs written so far "
            "stay: run the same command again to resume"
        )
    finally:
        db.dispose()


def _print_plan(summary: dict[str, Any], plan: Sequence[Mapping[str, Any]], as_json: bool) -> None:
    counts = {
        action: sum(1 for p in plan if p["action"] == action)
        for action in (backfill_rules.CREATE, backfill_rules.REPROCESS, backfill_rules.SKIP)
    }
    if as_json:
        click.echo(json.dumps({**summary, **counts, "runs": plan}, indent=2))
        return
    click.echo(f"dry run, nothing written: backfill of DAG {summary['dag_id']}, {_what(summary)}")
    first = "partition_key" if "partition_keys" in summary else "logical_date"
    rows = [dict(p) for p in plan]
    click.echo(format_table(rows, [first, "run_after", "action", "existing_state"]))
    click.echo(
        f"would create {counts['create']} run(s), re-run {counts['reprocess']}, "
        f"skip {counts['skip']}"
    )


def _what(summary: Mapping[str, Any]) -> str:
    """What a backfill runs, as its summary says: its keys, or its dates."""
    if "partition_keys" in summary:
        return f"{summary['partition_keys']} partition key(s)"
    return f"{summary['logical_dates']} logical date(s) from {summary['from']} to {summary['to']}"


def _print_result(summary: dict[str, Any], result: BackfillResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({**summary, **asdict(result)}, indent=2))
        return
    verb = "resumed" if result.resumed else "created"
    click.echo(
        f"{verb} backfill {result.backfill_id} of DAG {summary['dag_id']}: {_what(summary)}, "
        f"at most {summary['max_active_runs']} run(s) at once"
    )
    click.echo(
        f"created {result.created} run(s), re-ran {result.reprocessed}, skipped {result.skipped}"
    )
    if result.completed:
        click.echo(
            "nothing to run: every date already has a run (--reprocess failed or completed "
            "runs finished ones again)"
        )


@dataclass(frozen=True, slots=True)
class _PartitionRequest:
    keys_text: str
    reprocess: str
    max_active_runs: int
    dry_run: bool
    as_json: bool


def _backfill_partitions(
    ctx: click.Context,
    schedule: backfills.DagSchedule,
    timetable: Timetable,
    request: _PartitionRequest,
) -> None:
    """``--partitions``: one run per key (``engine.cli.partition_backfill``)."""
    dag_id = schedule.dag_id
    try:
        targets = partition_targets(dag_id, timetable, request.keys_text, now=utcnow())
    except PartitionKeysError as exc:
        fail(str(exc))
    summary = {
        "dag_id": dag_id,
        "partition_keys": len(targets),
        "max_active_runs": request.max_active_runs,
        "reprocess": request.reprocess,
        "dry_run": request.dry_run,
    }
    if request.dry_run:
        as_targets = [PartitionTarget(_key_of(timetable, t), t.run_after) for t in targets]
        plan = run_query(
            ctx,
            lambda s: backfill_rules.partition_backfill_plan(
                s, dag_id, as_targets, reprocess=request.reprocess
            ),
        )
        _print_plan(summary, plan, request.as_json)
        return
    keys = [_key_of(timetable, target) for target in targets]
    result = _write(
        ctx,
        dag_id,
        targets,
        (None, None),
        request.reprocess,
        request.max_active_runs,
        timetable,
        keys,
    )
    _print_result(summary, result, request.as_json)
    if schedule.is_paused and not request.as_json:
        click.echo(
            f"DAG {dag_id} is paused: its backfill runs wait until `sluice dags unpause {dag_id}`"
        )


def _key_of(timetable: Timetable, target: DagRunInfo | PartitionTarget) -> str:
    if isinstance(target, PartitionTarget):
        return target.partition_key
    key = timetable.partition_key_for(target)
    assert key is not None  # a CronPartitionTimetable keys every run
    return key
