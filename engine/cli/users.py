"""``sluice users ...``: who may use the REST API and web UI (their tokens:
``engine.cli.tokens``).

Users have a role, ``admin`` > ``op`` > ``viewer`` (a viewer reads; an op also pauses,
triggers, clears and emits; an admin also manages users' tokens). Passwords are read from a
prompt (typed twice) or, for scripts, from standard input with ``--password-stdin``, and
stored as Argon2id hashes.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from engine.api import credentials
from engine.cli.common import emit, fail, json_option, run_query, run_refusable
from engine.db.models import utcnow
from engine.db.queries import users as users_sql

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

ROLE_CHOICE = click.Choice(list(reversed(credentials.ROLES)))
USER_COLUMNS = ("username", "role", "active_tokens", "created", "updated")


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        return credentials.check_password(password)
    except credentials.CredentialError as exc:
        fail(str(exc))


def _write(ctx: click.Context, fn: Callable[[Session], Any]) -> Any:
    """``fn(session)`` in a write transaction; a ``UserError`` ends the command with it."""
    return run_refusable(ctx, fn, users_sql.UserError, writes=True)


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
