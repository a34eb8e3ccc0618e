"""``sluice users`` and ``sluice tokens``: who may use the REST API and web UI.

Users have a role, ``admin`` > ``op`` > ``viewer`` (a viewer reads; an op also pauses,
triggers, clears and emits; an admin also manages users' tokens). Passwords are read from a
prompt (typed twice) or, for scripts, from standard input with ``--password-stdin``, and
stored as Argon2id hashes. ``tokens create`` prints a new API token once (on stdout alone,
so ``TOKEN=$(sluice tokens create --user U)`` works); only its SHA-256 is stored.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from engine.api import credentials
from engine.cli.common import emit, fail, get_config, json_option, run_query
from engine.db.models import utcnow
from engine.db.queries import users as users_sql

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

ROLE_CHOICE = click.Choice(list(reversed(credentials.ROLES)))
USER_COLUMNS = ("username", "role", "active_tokens", "created", "updated")
TOKEN_COLUMNS = ("id", "user", "name", "prefix", "state", "expires", "last_used", "created")


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        return credentials.check_password(password)
    except credentials.CredentialError as exc:
        fail(str(exc))


def _write(ctx: click.Context, fn: Any) -> Any:
    """``fn(session)`` in a write transaction; a ``UserError`` ends the command with it."""

    def guarded(session: Session) -> Any:
        try:
            return fn(session)
        except users_sql.UserError as exc:
            return exc

    result = run_query(ctx, guarded, writes=True)
    if isinstance(result, users_sql.UserError):
        fail(str(result))
    return result


password_stdin_option = click.option(
    "--password-stdin", is_flag=True, help="Read the password from the first line of stdin."
)


@click.group()
def users() -> None:
    """Users of the REST API and web UI, with roles admin > op > viewer."""


@users.command("create")
@click.option("--username", required=True, help="Login name.")
@click.option("--role", type=ROLE_CHOICE, required=True, help="admin, op or viewer.")
@password_stdin_option
@click.pass_context
def users_create(ctx: click.Context, username: str, role: str, password_stdin: bool) -> None:
    """Create a user; the password is asked twice (or read from stdin)."""
    try:
        credentials.check_username(username)
    except credentials.CredentialError as exc:
        fail(str(exc))
    password_hash = credentials.hash_password(_read_password(password_stdin))
    add = partial(
        users_sql.add_user, username=username, role=role, password_hash=password_hash, now=utcnow()
    )
    _write(ctx, add)
    click.echo(f"Created user {username} with role {role}")


@users.command("list")
@json_option
@click.pass_context
def users_list(ctx: click.Context, as_json: bool) -> None:
    """Every user: role, active tokens, when created and last changed."""
    emit(run_query(ctx, partial(users_sql.list_users, now=utcnow())), USER_COLUMNS, as_json)


@users.command("delete")
@click.argument("username")
@click.pass_context
def users_delete(ctx: click.Context, username: str) -> None:
    """Delete USERNAME, its API tokens and its UI sessions."""
    _write(ctx, partial(users_sql.delete_user, username=username))
    click.echo(f"Deleted user {username}")


@users.command("set-password")
@click.argument("username")
@password_stdin_option
@click.pass_context
def users_set_password(ctx: click.Context, username: str, password_stdin: bool) -> None:
    """Change USERNAME's password; its UI sessions end (its tokens stay valid)."""
    password_hash = credentials.hash_password(_read_password(password_stdin))
    change = partial(
        users_sql.set_password_hash, username=username, password_hash=password_hash, now=utcnow()
    )
    _write(ctx, change)
    click.echo(f"Changed the password of {username}; its UI sessions ended")


@users.command("set-role")
@click.argument("username")
@click.argument("role", type=ROLE_CHOICE)
@click.pass_context
def users_set_role(ctx: click.Context, username: str, role: str) -> None:
    """Give USERNAME the role ROLE (admin, op or viewer); it applies to its next request."""
    _write(ctx, partial(users_sql.set_role, username=username, role=role, now=utcnow()))
    click.echo(f"{username} now has role {role}")


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
    token_id = _write(ctx, add)
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
