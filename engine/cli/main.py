"""The ``sluice`` command line."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version as dist_version
from typing import TYPE_CHECKING, Any

import click

from engine.cli.inspect import _fail
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    from engine.config import Config
    from engine.db.database import Database


def _config(ctx: click.Context) -> Config:
    cfg: Config | None = ctx.obj.get("config") if ctx.obj else None
    if cfg is None:
        from engine.config import load_config
        from engine.logs import configure_logging

        try:
            cfg = load_config()
        except SluiceError as exc:
            _fail(str(exc))
        ctx.ensure_object(dict)["config"] = cfg
        configure_logging(
            ctx.obj.get("log_level") or cfg.logging.level,
            ctx.obj.get("log_format") or cfg.logging.format,
            secrets=cfg.secret_values(),
        )
    return cfg


def _database(ctx: click.Context) -> Database:
    from engine.db.database import Database

    return Database(_config(ctx).core.sql_alchemy_conn)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default=None, help="Override [logging] level.")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default=None, help="Log line format."
)
@click.pass_context
def cli(ctx: click.Context, log_level: str | None, log_format: str | None) -> None:
    """Sluice: an event-driven asset scheduling engine."""
    ctx.ensure_object(dict)
    ctx.obj["log_level"] = log_level.upper() if log_level else None
    ctx.obj["log_format"] = log_format


@cli.command()
def version() -> None:
    """Print the installed version."""
    click.echo(dist_version("sluice"))


@cli.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def config_show(ctx: click.Context, as_json: bool) -> None:
    """Print the effective configuration (secrets redacted) and where each value came from."""
    from engine.config import render_config

    cfg = _config(ctx)
    click.echo(json.dumps(cfg.as_dict(redact=True), indent=2) if as_json else render_config(cfg))


@cli.group()
def db() -> None:
    """Manage the metadata database."""


@db.command("migrate")
@click.pass_context
def db_migrate(ctx: click.Context) -> None:
    """Create or upgrade the schema to the current revision."""
    from engine.db.schema import migrate

    database = _database(ctx)
    try:
        before, head = migrate(database.engine)
    except SluiceError as exc:
        _fail(str(exc))
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

    database = _database(ctx)
    try:
        check_schema(database.engine)
    except SluiceError as exc:
        _fail(str(exc))
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
        _fail("`sluice db reset` drops every table; pass --yes to confirm")
    database = _database(ctx)
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
    from engine.db.queries import triggers

    cfg = _config(ctx)
    cipher = KwargsCipher.from_config(cfg.core.fernet_key, cfg.home)
    database = _database(ctx)
    try:
        rotated, failures = database.call(lambda s: triggers.rotate_trigger_kwargs(s, cipher))
    finally:
        database.dispose()
    click.echo(f"re-encrypted {rotated} value(s)")
    for failure in failures:
        where = f"trigger {failure.trigger_id}: " if failure.trigger_id is not None else ""
        click.echo(f"{where}{failure.error}", err=True)
    if failures:
        sys.exit(1)


def _run_parts(ctx: click.Context, parts: tuple[str, ...], overrides: dict[str, Any]) -> None:
    from engine.supervisor import run_engine

    cfg = _config(ctx)
    try:
        code = run_engine(cfg, parts=parts, overrides=overrides)
    except SluiceError as exc:
        _fail(str(exc))
    sys.exit(code)


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the engine: DAG processor, scheduler, executor and triggerer under one supervisor."""
    from engine.supervisor import ALL_PARTS

    _run_parts(ctx, ALL_PARTS, {})


@cli.command()
@click.option("--capacity", type=int, default=None, help="Override [triggerer] capacity.")
@click.pass_context
def triggerer(ctx: click.Context, capacity: int | None) -> None:
    """Run a triggerer alone."""
    _run_parts(ctx, ("triggerer",), {"capacity": capacity} if capacity else {})


def _add_inspection_commands() -> None:
    from engine.cli import clean as cli_clean
    from engine.cli import inspect as cli_inspect
    from engine.cli import ops as cli_ops

    for group in (*cli_inspect.COMMAND_GROUPS, *cli_ops.COMMAND_GROUPS):
        cli.add_command(group)
    db.add_command(cli_clean.db_clean_command)


_add_inspection_commands()


@cli.command()
@click.pass_context
def scheduler(ctx: click.Context) -> None:
    """Run a scheduler alone."""
    _run_parts(ctx, ("scheduler",), {})


@cli.command("dag-processor")
@click.pass_context
def dag_processor(ctx: click.Context) -> None:
    """Run a DAG processor alone."""
    _run_parts(ctx, ("dag-processor",), {})


@cli.command()
@click.pass_context
def executor(ctx: click.Context) -> None:
    """Run a local executor alone."""
    _run_parts(ctx, ("executor",), {})


def main() -> None:
    cli(obj={})


if __name__ == "__main__":  # pragma: no cover
    main()
