"""``sluice doctor``: why tasks stay deferred or watchers do not fire, and what to do; the
checks are ``engine.doctor``'s, over facts read from the metadata database (so it works
from any host that can reach it).

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
from engine.cli.common import (
    database_settings,
    get_config,
    json_option,
    missing_database,
    open_database,
)
from engine.db.models import utcnow
from engine.exceptions import DatabaseError, SchemaNotCurrentError, SluiceError
from engine.views import doctor as doctor_view
from engine.views import jobs as jobs_view

if TYPE_CHECKING:
    from engine.config import Config


_CREATE_IT = (
    "run `sluice db migrate` with these settings, or point SLUICE_HOME or [core] "
    "sql_alchemy_conn at the database the engine uses"
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
    missing = missing_database(cfg)
    if missing is not None:  # a diagnosis creates no database
        where = "; ".join(line.strip() for line in database_settings(cfg).splitlines())
        problem = f"no database exists at {missing} ({where})"
        return [doctor.Finding("error", "database", problem, _CREATE_IT)]
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
