"""``sluice connections add|list|get|delete`` and ``sluice variables set|get|list|delete``.

Secrets are never printed unless asked for: a connection's password shows as ``***`` and
the values of sensitive extra keys (``password``, ``secret``, ``token``, ``api_key``, ...:
``engine.authoring.connections.SENSITIVE_NAMES``) too; a variable whose key looks sensitive
shows ``***`` in ``list`` and ``get``. ``--show-secret`` prints them in clear
(``connections get``, ``variables get`` and ``variables list``: never by default). Values
are stored encrypted with ``[core] fernet_key``.
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from engine.authoring.connections import (
    MASK,
    Connection,
    InvalidConnectionError,
    is_sensitive,
)
from engine.cli.common import emit, fail, get_config, json_option, run_query
from engine.db.queries import connections as store
from engine.exceptions import DecryptionError, SluiceError

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher

CONNECTION_COLUMNS = ("conn_id", "conn_type", "host", "port", "schema", "login", "password")


def _cipher(ctx: click.Context) -> KwargsCipher:
    from engine.crypto import KwargsCipher

    cfg = get_config(ctx)
    try:
        return KwargsCipher.from_config(cfg.core.fernet_key, cfg.home)
    except SluiceError as exc:
        fail(str(exc))


def _run(ctx: click.Context, fn: Callable[[Session], Any], *, writes: bool = False) -> Any:
    """``run_query``, where a value no key decrypts fails with its own error (it names the
    connection or variable), not a database hint."""
    problem: list[DecryptionError] = []

    def guarded(session: Session) -> Any:
        try:
            return fn(session)
        except DecryptionError as exc:
            problem.append(exc)
            return None

    result = run_query(ctx, guarded, writes=writes)
    if problem:
        fail(str(problem[0]))
    return result


# --- connections ------------------------------------------------------------------------


@click.group()
def connections() -> None:
    """Named connections (host, login, password, extra) tasks and triggers use."""


def _from_options(conn_id: str, options: dict[str, Any]) -> Connection:
    uri, text = options.pop("conn_uri"), options.pop("conn_json")
    fields = {k.removeprefix("conn_"): v for k, v in options.items() if v is not None}
    description = fields.pop("description", None)
    if sum(x is not None for x in (uri, text)) + bool(fields.get("type")) != 1:
        fail("give exactly one of --conn-uri, --conn-json or --conn-type (with its fields)")
    if uri is not None or text is not None:
        if fields:
            fail(f"--conn-{next(iter(fields))} cannot go with --conn-uri or --conn-json")
        if uri is not None and uri.lstrip().startswith("{"):
            fail("--conn-uri takes a URI; give a JSON connection with --conn-json")
        if uri is not None:
            conn = Connection.from_uri(conn_id, uri)
        else:
            conn = Connection.from_json(conn_id, text)
        if description is not None:
            conn.description = description
        return conn
    fields["conn_type"] = fields.pop("type")
    return Connection(conn_id, description=description, **fields)


@connections.command("add")
@click.argument("conn_id")
@click.option("--conn-uri", help="Airflow's URI form: type://login:password@host:port/schema?k=v")
@click.option("--conn-json", help='The JSON form: {"conn_type": ..., "host": ..., "extra": {}}')
@click.option("--conn-type", help="The connection type (postgres, aws, kafka, http, ...)")
@click.option("--conn-host")
@click.option("--conn-login")
@click.option("--conn-password")
@click.option("--conn-port")
@click.option("--conn-schema")
@click.option("--conn-extra", help="A JSON object")
@click.option("--conn-description")
@click.pass_context
def connections_add(ctx: click.Context, /, conn_id: str, **options: Any) -> None:
    """Add connection CONN_ID (an existing one is an error: delete it first)."""
    try:
        conn = _from_options(conn_id, options)
    except InvalidConnectionError as exc:
        fail(str(exc))
    cipher = _cipher(ctx)

    def add(session: Session) -> bool:
        if store.connection_exists(session, conn_id):
            return False
        return store.upsert_connection(session, cipher, conn_id, conn.to_dict())

    if not _run(ctx, add, writes=True):
        fail(f"a connection with conn_id {conn_id!r} already exists; delete it first")
    click.echo(f"added connection {conn_id}: {conn.masked_uri()}")


def _connection_row(conn: Connection, *, show_secret: bool) -> dict[str, Any]:
    if show_secret:
        return {"conn_id": conn.conn_id, **conn.to_dict()}
    return conn.masked_dict()


@connections.command("list")
@json_option
@click.pass_context
def connections_list(ctx: click.Context, as_json: bool) -> None:
    """Every connection, passwords and sensitive extra values as ***."""
    found = _run(ctx, partial(store.list_connections, cipher=_cipher(ctx)))
    rows = [_connection_row(Connection.from_dict(i, f), show_secret=False) for i, f in found]
    emit(rows, (*CONNECTION_COLUMNS, "extra", "description"), as_json)


@connections.command("get")
@click.argument("conn_id")
@json_option
@click.option("--show-secret", is_flag=True, help="Print the password and extra in clear.")
@click.pass_context
def connections_get(ctx: click.Context, conn_id: str, as_json: bool, show_secret: bool) -> None:
    """One connection (the environment's SLUICE_CONN_<ID> first, as tasks see it)."""
    from engine.authoring.connections import connection_from_env

    try:
        conn = connection_from_env(conn_id)
    except InvalidConnectionError as exc:
        fail(str(exc))
    if conn is None:
        fields = _run(ctx, partial(store.get_connection, cipher=_cipher(ctx), conn_id=conn_id))
        if fields is None:
            fail(f"no connection with conn_id {conn_id!r}")
        conn = Connection.from_dict(conn_id, fields)
    row = _connection_row(conn, show_secret=show_secret)
    row["uri"] = conn.get_uri() if show_secret else conn.masked_uri()
    if as_json:
        click.echo(json.dumps(row, indent=2))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            shown = json.dumps(value) if isinstance(value, dict) else value
            click.echo(f"{key.ljust(width)}  {'-' if shown in (None, '') else shown}")


@connections.command("delete")
@click.argument("conn_id")
@click.pass_context
def connections_delete(ctx: click.Context, conn_id: str) -> None:
    """Delete connection CONN_ID."""
    if not _run(ctx, partial(store.delete_connection, conn_id=conn_id), writes=True):
        fail(f"no connection with conn_id {conn_id!r}")
    click.echo(f"deleted connection {conn_id}")


# --- variables --------------------------------------------------------------------------


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
        store.set_variable, cipher=_cipher(ctx), key=key, value=value, description=description
    )
    created = _run(ctx, query, writes=True)
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
        value = _run(ctx, partial(store.get_variable, cipher=_cipher(ctx), key=key))
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
    found = _run(ctx, partial(store.list_variables, cipher=_cipher(ctx)))
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
    if not _run(ctx, partial(store.delete_variable, key=key), writes=True):
        fail(f"variable {key!r} does not exist")
    click.echo(f"deleted variable {key}")
