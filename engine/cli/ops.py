"""Operator commands: ``sluice streams|jobs|triggers list`` and ``sluice doctor``.

They read the metadata database only, so they work from any host that can reach it.
Liveness uses the configured health thresholds: ``[triggerer] health_check_threshold_s`` for
triggerers, ``[scheduler] health_check_threshold_s`` for every other part.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING

import click

from engine import doctor
from engine.cli.common import emit, get_config, json_option, open_database, run_query
from engine.db.models import utcnow
from engine.exceptions import DatabaseError, SchemaNotCurrentError, SluiceError
from engine.views import doctor as doctor_view
from engine.views import jobs as jobs_view
from engine.views import streams as streams_view
from engine.views import triggers as triggers_view

if TYPE_CHECKING:
    from engine.config import Config


def _lanes(value: dict[str, int]) -> str:
    return " ".join(f"{lane}={count}" for lane, count in value.items()) or "-"


@click.group()
def streams() -> None:
    """Shared-stream groups of the live triggerers."""


@streams.command("list")
@json_option
@click.pass_context
def streams_list(ctx: click.Context, as_json: bool) -> None:
    """Each group: mode, subscribers, backlog per lane, oldest unresolved event, counters."""
    query = partial(
        streams_view.list_stream_groups, now=utcnow(), config=get_config(ctx), history=False
    )
    rows = [{k: r[k] for k in _STREAM_KEYS} for r in run_query(ctx, query)["items"]]
    if not as_json:
        rows = [{**r, "outstanding_by_lane": _lanes(r["outstanding_by_lane"])} for r in rows]
    columns = [
        "triggerer_id",
        "key",
        "mode",
        "subscribers",
        "outstanding_by_lane",
        "oldest_unresolved_age_s",
        "advances",
        "last_advance_batch",
        "overflows",
        "ack_timeouts",
        "rejects",
        "snapshot_age_s",
    ]
    emit(rows, columns, as_json)


#: What ``streams list --json`` prints of each group.
_STREAM_KEYS = (
    "triggerer_id",
    "key",
    "mode",
    "subscribers",
    "outstanding_by_lane",
    "oldest_unresolved_age_s",
    "queue_high_water",
    "events_polled",
    "deliveries",
    "advances",
    "advanced_events",
    "last_advance_batch",
    "advance_latency_sum_s",
    "overflows",
    "ack_timeouts",
    "rejects",
    "snapshot_age_s",
)


@click.group()
def jobs() -> None:
    """Engine parts (triggerer, scheduler, executor) and their heartbeats."""


@jobs.command("list")
@click.option("--all", "include_ended", is_flag=True, help="Include jobs that ended.")
@json_option
@click.pass_context
def jobs_list(ctx: click.Context, include_ended: bool, as_json: bool) -> None:
    """Each job: host and pid, state, heartbeat age, alive?, load / capacity, and the queues
    of a Celery worker (its load: the tries it runs)."""
    query = partial(
        jobs_view.list_jobs, now=utcnow(), config=get_config(ctx), include_ended=include_ended
    )
    columns = ["id", "type", "hostname", "pid", "state", "heartbeat_age_s", "alive", "load"]
    emit(run_query(ctx, query)["items"], [*columns, "capacity", "queues"], as_json)


@click.group()
def triggers() -> None:
    """Trigger rows: who runs them and what they serve."""


@triggers.command("list")
@json_option
@click.pass_context
def triggers_list(ctx: click.Context, as_json: bool) -> None:
    """Each trigger: class, owner triggerer (alive?), age, what it serves, load failure."""
    query = partial(triggers_view.list_triggers, now=utcnow(), config=get_config(ctx))
    rows = [{k: r[k] for k in _TRIGGER_KEYS} for r in run_query(ctx, query)["items"]]
    columns = ["id", "classpath", "triggerer_id", "owner_alive", "age_s", "serves"]
    emit(rows, [*columns, "failures", "last_failure_age_s", "load_failed"], as_json)


#: What ``triggers list --json`` prints of each trigger.
_TRIGGER_KEYS = (
    "id",
    "classpath",
    "kind",
    "triggerer_id",
    "owner_alive",
    "age_s",
    "serves",
    "failures",
    "last_failure_age_s",
    "load_failed",
    "last_error",
)


@click.command("doctor")
@json_option
@click.pass_context
def doctor_command(ctx: click.Context, as_json: bool) -> None:
    """Find why tasks stay deferred or watchers do not fire; say what to do.

    Exits 0 when nothing is wrong, 1 when any error-level problem is found.
    """
    cfg = get_config(ctx)
    findings = _examine(ctx, cfg)
    if as_json:
        click.echo(json.dumps([asdict(f) for f in findings], indent=2))
    elif not findings:
        click.echo("no problems found")
    for finding in [] if as_json else findings:
        click.echo(f"{finding.severity.upper()} [{finding.check}] {finding.problem}")
        click.echo(f"    -> {finding.action}")
    sys.exit(1 if doctor.has_errors(findings) else 0)


def _examine(ctx: click.Context, cfg: Config) -> list[doctor.Finding]:
    from engine.db.schema import check_schema

    thresholds, default = jobs_view.liveness(cfg)
    database = open_database(ctx)
    findings: list[doctor.Finding] = []
    try:
        try:
            check_schema(database.engine)
        except SchemaNotCurrentError as exc:
            findings.append(doctor.Finding("error", "schema", str(exc), "run `sluice db migrate`"))
        except DatabaseError:
            pass  # the database cannot be read: the read below says so, once
        read = partial(
            doctor_view.doctor_facts,
            now=utcnow(),
            thresholds=thresholds,
            default_threshold_s=default,
        )
        try:
            facts = database.call(read, read_only=True)
        except SluiceError as exc:
            findings.append(_unreadable(exc))
            return findings
    finally:
        database.dispose()
    claim_grace_s = cfg.triggerer.health_check_threshold_s
    return findings + doctor.diagnose(facts, claim_grace_s=claim_grace_s)


def _unreadable(exc: SluiceError) -> doctor.Finding:
    return doctor.Finding(
        "error",
        "database",
        f"cannot read the metadata database: {exc}",
        "check [core] sql_alchemy_conn and that the database is up; then `sluice db migrate`",
    )
