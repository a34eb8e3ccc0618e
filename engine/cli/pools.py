"""``sluice pools``: Airflow's slot pools (``set``, ``list``, ``get``, ``delete``).

A task takes ``pool_slots`` of its ``pool`` while queued or running (and deferred, for a pool
with ``--include-deferred``); executors start it only while the pool has that many open.
Tasks that name no pool run in ``default_pool`` (128 slots, as Airflow's; it can be resized,
not deleted).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import click

from engine.cli.common import emit, fail, json_option, run_query
from engine.db.queries import pools as pools_sql

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

COLUMNS = ("pool", "slots", "running", "queued", "deferred", "open", "include_deferred")


@click.group()
def pools() -> None:
    """Slot pools that cap how many tasks run at once."""


@pools.command("set", context_settings={"ignore_unknown_options": True})  # SLOTS may be -1
@click.argument("name")
@click.argument("slots", type=int)
@click.option("--description", default=None, help="What the pool is for.")
@click.option(
    "--include-deferred/--exclude-deferred",
    default=None,
    help="Whether deferred tasks occupy their slots (new pools: excluded).",
)
@json_option
@click.pass_context
def pools_set(
    ctx: click.Context,
    name: str,
    slots: int,
    description: str | None,
    include_deferred: bool | None,
    as_json: bool,
) -> None:
    """Create pool NAME with SLOTS slots (-1: unlimited), or change it."""
    try:
        pools_sql.check_slots(slots)
    except pools_sql.PoolError as exc:
        fail(str(exc))

    def write(session: Session) -> pools_sql.PoolUsage | str:
        try:
            return pools_sql.set_pool(
                session,
                name,
                slots=slots,
                description=description,
                include_deferred=include_deferred,
            )
        except pools_sql.PoolError as exc:
            return str(exc)

    usage = run_query(ctx, write, writes=True)
    if isinstance(usage, str):
        fail(usage)
    emit([usage.as_dict()], (*COLUMNS, "description"), as_json)


@pools.command("list")
@json_option
@click.pass_context
def pools_list(ctx: click.Context, as_json: bool) -> None:
    """Every pool: slots, the slots its running, queued and deferred tasks take, open slots."""
    rows = [usage.as_dict() for usage in run_query(ctx, pools_sql.list_pools)]
    emit(rows, (*COLUMNS, "description"), as_json)


@pools.command("get")
@click.argument("name")
@json_option
@click.pass_context
def pools_get(ctx: click.Context, name: str, as_json: bool) -> None:
    """One pool and its occupancy."""
    usage = run_query(ctx, partial(pools_sql.get_pool, name=name))
    if usage is None:
        fail(f"no pool named {name!r} (`sluice pools list` shows them)")
    emit([usage.as_dict()], (*COLUMNS, "description"), as_json)


@pools.command("delete")
@click.argument("name")
@click.pass_context
def pools_delete(ctx: click.Context, name: str) -> None:
    """Delete pool NAME (not default_pool). Its tasks then wait in ``scheduled`` until a pool
    of that name exists again."""

    def write(session: Session) -> bool | str:
        try:
            return pools_sql.delete_pool(session, name)
        except pools_sql.PoolError as exc:
            return str(exc)

    deleted = run_query(ctx, write, writes=True)
    if isinstance(deleted, str):
        fail(deleted)
    if not deleted:
        fail(f"no pool named {name!r} (`sluice pools list` shows them)")
    click.echo(f"Deleted pool {name}")
