"""The engine's processes: ``sluice run`` (every part under one supervisor) and
``sluice triggerer|scheduler|dag-processor|executor|api-server`` (one part alone)."""

from __future__ import annotations

import sys
from typing import Any

import click

from engine.cli.common import fail, get_config
from engine.exceptions import SluiceError


def _run_parts(ctx: click.Context, parts: tuple[str, ...], overrides: dict[str, Any]) -> None:
    from engine.supervisor import run_engine

    cfg = get_config(ctx)
    try:
        code = run_engine(cfg, parts=parts, overrides=overrides)
    except SluiceError as exc:
        fail(str(exc))
    sys.exit(code)


@click.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the engine: DAG processor, scheduler, executor, triggerer and the API/UI server
    under one supervisor."""
    from engine.supervisor import ALL_PARTS

    _run_parts(ctx, ALL_PARTS, {})


@click.command()
@click.option("--capacity", type=int, default=None, help="Override [triggerer] capacity.")
@click.pass_context
def triggerer(ctx: click.Context, capacity: int | None) -> None:
    """Run a triggerer alone."""
    _run_parts(ctx, ("triggerer",), {"capacity": capacity} if capacity else {})


@click.command()
@click.pass_context
def scheduler(ctx: click.Context) -> None:
    """Run a scheduler alone."""
    _run_parts(ctx, ("scheduler",), {})


@click.command("dag-processor")
@click.pass_context
def dag_processor(ctx: click.Context) -> None:
    """Run a DAG processor alone."""
    _run_parts(ctx, ("dag-processor",), {})


@click.command()
@click.pass_context
def executor(ctx: click.Context) -> None:
    """Run a local executor alone."""
    _run_parts(ctx, ("executor",), {})


@click.command("api-server")
@click.option("--host", default=None, help="Override [api] host (default 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Override [api] port.")
@click.pass_context
def api_server(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Run the REST API and web UI alone (several may run behind a load balancer)."""
    overrides: dict[str, Any] = {}
    if host:
        overrides["api_host"] = host
    if port is not None:
        overrides["api_port"] = port
    _run_parts(ctx, ("api",), overrides)
