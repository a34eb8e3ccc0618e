"""``sluice config show``: the effective configuration and where each value came from."""

from __future__ import annotations

import json

import click

from engine.cli.common import get_config


@click.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def config_show(ctx: click.Context, as_json: bool) -> None:
    """Print the effective configuration (secrets redacted) and where each value came from."""
    from engine.config import render_config

    cfg = get_config(ctx)
    click.echo(json.dumps(cfg.as_dict(redact=True), indent=2) if as_json else render_config(cfg))
