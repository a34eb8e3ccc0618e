"""``sluice variables set|get|list|delete``: the named values tasks and templates read.

A variable whose key looks sensitive (``password``, ``secret``, ``token``, ``api_key``, ...:
``engine.authoring.connections.SENSITIVE_NAMES``) shows ``***`` in ``list`` and ``get``;
``--show-secret`` prints it in clear (never by default). Values are stored encrypted with
``[core] fernet_key``.
"""

from __future__ import annotations

import json
import os
from functools import partial

import click

from engine.authoring.connections import MASK, is_sensitive
from engine.cli.common import emit, fail, json_option, kwargs_cipher, run_refusable
from engine.db.queries import connections as store
from engine.exceptions import DecryptionError


@click.group()
def variables() -> None:
    """Named values tasks read with Variable.get and templates with {{ var.value.key }}."""


@variables.command("set")
@click.argument("key")
@click.argument("value")
@click.option("--description")
@click.option("--json", "as_json", is_flag=True, help="VALUE is JSON: check and store it.")
@click.pass_context
def variables_set(
    ctx: click.Context, key: str, value: str, description: str | None, as_json: bool
) -> None:
    """Create or replace variable KEY."""
    if as_json:
        try:
            value = json.dumps(json.loads(value), indent=2)
        except ValueError as exc:
            fail(f"variable {key!r}: --json given but the value is not JSON: {exc}")
    query = partial(
        store.set_variable, cipher=kwargs_cipher(ctx), key=key, value=value, description=description
    )
    created = run_refusable(ctx, query, DecryptionError, writes=True)
    click.echo(f"{'created' if created else 'updated'} variable {key}")


def _shown(key: str, value: str | None, *, show_secret: bool) -> str | None:
    return MASK if value and is_sensitive(key) and not show_secret else value


@variables.command("get")
@click.argument("key")
@click.option("--default", "default", help="Print this when KEY is not set (else exit 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the value as parsed JSON.")
@click.option("--show-secret", is_flag=True, help="Print a sensitive variable in clear.")
@click.pass_context
def variables_get(
    ctx: click.Context, key: str, default: str | None, as_json: bool, show_secret: bool
) -> None:
    """Print variable KEY (``***`` for a sensitive key unless --show-secret)."""
    from engine.authoring.connections import var_env_name

    value = os.environ.get(var_env_name(key))
    if value is None:
        value = run_refusable(
            ctx,
            partial(store.get_variable, cipher=kwargs_cipher(ctx, writes=False), key=key),
            DecryptionError,
        )
    if value is None:
        if default is None:
            fail(f"variable {key!r} does not exist")
        value = default
    shown = _shown(key, value, show_secret=show_secret)
    if as_json and shown != MASK:
        try:
            shown = json.dumps(json.loads(value), indent=2)
        except ValueError as exc:
            fail(f"variable {key!r} does not hold JSON: {exc}")
    click.echo(shown)


@variables.command("list")
@json_option
@click.option("--show-secret", is_flag=True, help="Print sensitive variables in clear.")
@click.pass_context
def variables_list(ctx: click.Context, as_json: bool, show_secret: bool) -> None:
    """Every variable (sensitive ones as ***)."""
    found = run_refusable(
        ctx, partial(store.list_variables, cipher=kwargs_cipher(ctx, writes=False)), DecryptionError
    )
    rows = [
        {"key": k, "value": _shown(k, v, show_secret=show_secret), "description": d}
        for k, v, d in found
    ]
    emit(rows, ("key", "value", "description"), as_json)


@variables.command("delete")
@click.argument("key")
@click.pass_context
def variables_delete(ctx: click.Context, key: str) -> None:
    """Delete variable KEY."""
    if not run_refusable(
        ctx, partial(store.delete_variable, key=key), DecryptionError, writes=True
    ):
        fail(f"variable {key!r} does not exist")
    click.echo(f"deleted variable {key}")
