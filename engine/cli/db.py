"""``sluice db ...``: manage the metadata database: migrate, check, reset,
rotate-fernet-key, and clean (delete old rows, in batches, safely while the engine runs: the
batches, the cut-offs and what is kept whatever the cut-off are ``engine.cli.db_clean``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from engine.cli import db_clean
from engine.cli.common import fail, get_config, open_database
from engine.db.models import utcnow
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    from engine.config import Config
    from engine.db.database import Database


@click.group()
def db() -> None:
    """Manage the metadata database."""


@db.command("migrate")
@click.pass_context
def db_migrate(ctx: click.Context) -> None:
    """Create or upgrade the schema to the current revision."""
    from engine.db.schema import migrate

    database = open_database(ctx)
    try:
        before, head = migrate(database.engine)
    except SluiceError as exc:
        fail(str(exc))
    finally:
        database.dispose()
    if before == head:
        click.echo(f"schema already current at revision {head}")
    else:
        click.echo(f"migrated schema from {before or 'empty'} to {head}")


@db.command("check")
@click.pass_context
def db_check(ctx: click.Context) -> None:
    """Exit 0 when the schema is current, 1 (with the reason) otherwise; creates no
    database where there is none."""
    from engine.db.schema import check_schema, head_revision

    database = open_database(ctx, writes=False)
    try:
        check_schema(database.engine)
    except SluiceError as exc:
        fail(str(exc))
    finally:
        database.dispose()
    click.echo(f"schema is current (revision {head_revision()})")


@db.command("reset")
@click.option("--yes", is_flag=True, help="Confirm that every table may be dropped.")
@click.pass_context
def db_reset(ctx: click.Context, yes: bool) -> None:
    """Drop all tables and re-create the schema (destroys all data)."""
    from engine.db.schema import reset

    if not yes:
        fail("`sluice db reset` drops every table; pass --yes to confirm")
    database = open_database(ctx)
    try:
        reset(database.engine)
    finally:
        database.dispose()
    click.echo("database reset")


@db.command("rotate-fernet-key")
@click.pass_context
def db_rotate(ctx: click.Context) -> None:
    """Re-encrypt every trigger's kwargs with the first key of [core] fernet_key."""
    from engine.crypto import KwargsCipher
    from engine.db.queries import triggers as trigger_rows

    cfg = get_config(ctx)
    cipher = KwargsCipher.from_config(cfg.core.fernet_key, cfg.home)
    database = open_database(ctx)
    try:
        rotated, failures = database.call(lambda s: trigger_rows.rotate_trigger_kwargs(s, cipher))
    finally:
        database.dispose()
    click.echo(f"re-encrypted {rotated} value(s)")
    for failure in failures:
        where = f"trigger {failure.trigger_id}: " if failure.trigger_id is not None else ""
        click.echo(f"{where}{failure.error}", err=True)
    if failures:
        sys.exit(1)


_TABLES_HELP = "Comma-separated tables to clean (default: all): " + "; ".join(
    f"{name} = {what}" for name, what in db_clean.DESCRIPTIONS.items()
)


@db.command("clean")
@click.option(
    "--before",
    "before_text",
    required=True,
    metavar="WHEN",
    help="Delete rows older than this: an ISO timestamp (naive = UTC) or an age "
    "(90s, 15m, 12h, 30d, 2w).",
)
@click.option("--tables", default=None, metavar="NAMES", help=_TABLES_HELP)
@click.option("--dry-run", is_flag=True, help="Only print how many rows would be deleted.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=db_clean.DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Rows deleted per transaction.",
)
@click.pass_context
def db_clean_command(
    ctx: click.Context,
    before_text: str,
    tables: str | None,
    dry_run: bool,
    yes: bool,
    batch_size: int,
) -> None:
    """Delete finished runs, old asset events, unused triggers, dead jobs and snapshots,
    and task state store entries past their retention.

    Never deleted: an asset event inside the dedup window ([core]
    asset_event_dedup_retention_sec) or that a DAG has not run on yet or that an unfinished
    run uses; an unfinished run; a trigger in use; a live job or one that owns triggers.
    """
    cfg = get_config(ctx)
    plan = _plan(cfg, before_text, tables)
    database = open_database(ctx, writes=not dry_run)  # a dry run only counts
    try:
        _clean(database, plan, dry_run=dry_run, yes=yes, batch_size=batch_size)
    except SluiceError as exc:
        fail(str(exc))
    finally:
        database.dispose()


def _plan(cfg: Config, before_text: str, tables: str | None) -> db_clean.CleanPlan:
    now = utcnow()
    try:
        before = db_clean.parse_before(before_text, now=now)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--before") from exc
    try:
        names = db_clean.parse_tables(tables)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tables") from exc
    dead_after_s = db_clean.long_dead_after_s(
        cfg.triggerer.health_check_threshold_s, cfg.scheduler.health_check_threshold_s
    )
    return db_clean.make_plan(
        names,
        before=before,
        now=now,
        dedup_retention_s=cfg.core.asset_event_dedup_retention_sec,
        dead_after_s=dead_after_s,
    )


def _clean(
    database: Database, plan: db_clean.CleanPlan, *, dry_run: bool, yes: bool, batch_size: int
) -> None:
    cutoffs = plan.cutoffs
    click.echo(f"Rows older than {cutoffs.before.isoformat()}")
    dedup = cutoffs.dedup_before.isoformat()
    click.echo(f"(asset events with a dedup key: older than {dedup}, the dedup window's start)")
    counts = db_clean.count(database, plan)
    for line in db_clean.summary_lines(counts, dry_run=True):
        click.echo(line)
    if dry_run:
        return
    if not any(counts.values()):
        click.echo("nothing to delete")
        return
    if not yes:
        click.confirm("Delete these rows?", abort=True)
    deleted = db_clean.clean(database, plan, batch_size=batch_size)
    for line in db_clean.summary_lines(deleted, dry_run=False):
        click.echo(line)
