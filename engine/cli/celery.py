"""``sluice celery worker``: a Celery worker that runs Sluice task tries
(``engine.executor.celery.worker``), for ``[executor] kind = "celery"``."""

from __future__ import annotations

import os
import socket
import sys

import click

from engine.cli.common import fail, get_config
from engine.exceptions import SluiceError
from triggers.extras import missing_extra


@click.group()
def celery() -> None:
    """The Celery executor's workers."""


def _queues(value: str | None, default: str) -> tuple[str, ...]:
    names = tuple(q.strip() for q in (value or default).split(",") if q.strip())
    if not names:
        raise click.BadParameter("name at least one queue, e.g. --queues default,gpu")
    return names


def _node_name(name: str | None) -> str:
    from celery.utils.nodenames import host_format

    node = name or f"sluice-{os.getpid()}"
    if "@" not in node:
        node = f"{node}@{socket.gethostname()}"
    return str(host_format(node))


@celery.command()
@click.option(
    "--queues",
    "-q",
    default=None,
    help="Comma-separated queues to consume (default: [celery] default_queue).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=None,
    help="Tries run at a time (default: [celery] worker_concurrency).",
)
@click.option(
    "--name",
    "-n",
    default=None,
    help="The worker's Celery node name, NAME[@HOST] (%h: the host name; default: "
    "sluice-<pid>@<host>).",
)
@click.pass_context
def worker(
    ctx: click.Context, queues: str | None, concurrency: int | None, name: str | None
) -> None:
    """Run a Celery worker: it takes the tries `sluice run` sends to its queues and runs
    each with the same task runner as the local executor. SIGTERM stops it after its
    running tries finished."""
    problem = missing_extra("celery", needed_by="sluice celery worker")
    if problem is not None:
        fail(problem)
    from engine.executor.celery.worker import run_worker

    cfg = get_config(ctx)
    if cfg.executor.kind != "celery":
        click.echo(
            'warning: [executor] kind is not "celery": nothing sends tries to this worker',
            err=True,
        )
    try:
        code = run_worker(
            cfg,
            queues=_queues(queues, cfg.celery.default_queue),
            concurrency=concurrency or cfg.celery.worker_concurrency,
            hostname=_node_name(name),
            loglevel=(ctx.obj.get("log_level") or cfg.logging.level),
        )
    except SluiceError as exc:
        fail(str(exc))
    sys.exit(code)
