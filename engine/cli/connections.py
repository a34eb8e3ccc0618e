"""``sluice connections add|list|get|delete``: the named connections tasks and triggers use.

Secrets are never printed unless asked for: a connection's password shows as ``***`` and
the values of sensitive extra keys (``password``, ``secret``, ``token``, ``api_key``, ...:
``engine.authoring.connections.SENSITIVE_NAMES``) too; ``connections get --show-secret``
prints them in clear. Connections are stored encrypted with ``[core] fernet_key``.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from engine.authoring.connections import (
    Connection,
    InvalidConnectionError,
)
from engine.cli.common import emit, fail, json_option, kwargs_cipher, run_refusable
from engine.db.queries import connections as store
from engine.exceptions import DecryptionError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

CONNECTION_COLUMNS = ("conn_id", "conn_type", "host", "port", "schema", "login", "password")


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
    cipher = kwargs_cipher(ctx)

    def add(session: Session) -> bool:
        if store.connection_exists(session, conn_id):
            return False
        return store.upsert_connection(session, cipher, conn_id, conn.to_dict())

    if not run_refusable(ctx, add, DecryptionError, writes=True):
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
    found = run_refusable(
        ctx,
        partial(store.list_connections, cipher=kwargs_cipher(ctx, writes=False)),
        DecryptionError,
    )
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
        fields = run_refusable(
            ctx,
            partial(store.get_connection, cipher=kwargs_cipher(ctx, writes=False), conn_id=conn_id),
            DecryptionError,
        )
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
    if not run_refusable(
        ctx, partial(store.delete_connection, conn_id=conn_id), DecryptionError, writes=True
    ):
        fail(f"no connection with conn_id {conn_id!r}")
    click.echo(f"deleted connection {conn_id}")
