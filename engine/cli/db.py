"""``sluice db ...``: manage the metadata database (migrate, check, reset, rotate-fernet-key).

``db clean`` lives in ``engine.cli.clean``; this module adds it to the group.
"""

from __future__ import annotations

import sys

import click

from engine.cli.clean import db_clean_command
from engine.cli.common import fail, get_config, open_database
from engine.exceptions import SluiceError


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
    """Exit 0 when the schema is current, 1 (with the reason) otherwise."""
    from engine.db.schema import check_schema, head_revision

    database = open_database(ctx)
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


db.add_command(db_clean_command)
