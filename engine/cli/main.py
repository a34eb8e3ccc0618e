"""The ``sluice`` command line: the root group, ``sluice version``, and every other module's
commands added to the root group."""

from __future__ import annotations

from importlib.metadata import version as dist_version

import click

from engine.cli.assets import assets
from engine.cli.celery import celery
from engine.cli.config import config
from engine.cli.connections import connections
from engine.cli.dags import dags
from engine.cli.db import db
from engine.cli.doctor import doctor_command
from engine.cli.jobs import jobs
from engine.cli.pools import pools
from engine.cli.processes import api_server, dag_processor, executor, run, scheduler, triggerer
from engine.cli.runs import runs
from engine.cli.streams import streams
from engine.cli.tasks import tasks
from engine.cli.tokens import tokens
from engine.cli.triggers import triggers
from engine.cli.users import users
from engine.cli.variables import variables


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sluice", prog_name="sluice", message="%(prog)s %(version)s")
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


for _command in (
    # the engine's processes
    run,
    triggerer,
    scheduler,
    dag_processor,
    executor,
    api_server,
    celery,
    # setup and maintenance
    config,
    db,
    users,
    tokens,
    # the workflow nouns
    dags,
    runs,
    assets,
    tasks,
    connections,
    variables,
    pools,
    # operator views
    streams,
    jobs,
    triggers,
    doctor_command,
):
    cli.add_command(_command)


def main() -> None:
    cli(obj={})


if __name__ == "__main__":  # pragma: no cover
    main()
