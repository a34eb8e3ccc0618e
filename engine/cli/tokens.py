"""``sluice tokens ...``: the API tokens of users (``Authorization: Bearer <token>``).

``tokens create`` prints a new API token once (on stdout alone, so
``TOKEN=$(sluice tokens create --user U)`` works); only its SHA-256 is stored, with its
expiry (default ``[api] token_expiry_days``).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

import click

from engine.api import credentials
from engine.cli.common import emit, fail, get_config, json_option, run_query, run_refusable
from engine.db.models import utcnow
from engine.db.queries import users as users_sql

if TYPE_CHECKING:
    from datetime import datetime

TOKEN_COLUMNS = ("id", "user", "name", "prefix", "state", "expires", "last_used", "created")


@click.group()
def tokens() -> None:
    """API tokens (``Authorization: Bearer <token>``): stored hashed, with expiry."""


def _expiry(ctx: click.Context, expires_in: str | None, no_expiry: bool) -> datetime | None:
    if no_expiry and expires_in is not None:
        fail("give --expires-in or --no-expiry, not both")
    if no_expiry:
        return None
    if expires_in is None:
        return utcnow() + timedelta(days=get_config(ctx).api.token_expiry_days)
    try:
        return utcnow() + credentials.parse_duration(expires_in)
    except credentials.CredentialError as exc:
        fail(f"--expires-in: {exc}")


@tokens.command("create")
@click.option("--user", "username", required=True, help="Whose token it is.")
@click.option("--name", default=None, help="What the token is for (shown in listings).")
@click.option(
    "--expires-in", default=None, help="Lifetime like 30d, 12h (default: [api] token_expiry_days)."
)
@click.option("--no-expiry", is_flag=True, help="A token that never expires.")
@click.pass_context
def tokens_create(
    ctx: click.Context, username: str, name: str | None, expires_in: str | None, no_expiry: bool
) -> None:
    """Make an API token for USER and print it (once: it is stored only hashed)."""
    expires = _expiry(ctx, expires_in, no_expiry)
    token = credentials.new_token()
    add = partial(
        users_sql.add_token,
        username=username,
        token_hash=credentials.digest(token),
        prefix=credentials.shown_prefix(token),
        name=name,
        expires_at=expires,
        now=utcnow(),
    )
    token_id = run_refusable(ctx, add, users_sql.UserError, writes=True)
    until = f"expires {expires.isoformat(timespec='seconds')}" if expires else "never expires"
    click.echo(
        f"Token {token_id} for {username} ({until}); it is shown only now: store it safely",
        err=True,
    )
    click.echo(token)


@tokens.command("list")
@click.option("--user", "username", default=None, help="Only this user's tokens.")
@json_option
@click.pass_context
def tokens_list(ctx: click.Context, username: str | None, as_json: bool) -> None:
    """Tokens with their state (active, expired, revoked); never the tokens themselves."""
    rows = run_query(ctx, partial(users_sql.list_tokens, now=utcnow(), username=username))
    emit(rows, TOKEN_COLUMNS, as_json)


@tokens.command("revoke")
@click.argument("token_id", type=int)
@click.pass_context
def tokens_revoke(ctx: click.Context, token_id: int) -> None:
    """Revoke token TOKEN_ID (see ``tokens list``): requests with it get 401 from now on."""
    found = run_query(
        ctx, partial(users_sql.revoke_token, token_id=token_id, now=utcnow()), writes=True
    )
    if not found:
        fail(f"no token {token_id} (`sluice tokens list` shows them)")
    click.echo(f"Revoked token {token_id}")
