"""``sluice assets ...``: every asset (list), the events of one (events), its partitions
(partitions: the table is drawn by ``engine.cli.partitions_text``), what it keeps in its
asset state store (state), and an event recorded by hand, as a watcher would (emit).
Tables, or ``--json``.
"""

from __future__ import annotations

import json
from typing import Any

import click

from engine.authoring.timetables import timezone_of
from engine.cli import partitions_text
from engine.cli.common import (
    cli_actor,
    emit,
    fail,
    get_config,
    json_option,
    parse_date,
    parse_json_object,
    run_query,
)
from engine.db import models
from engine.db.queries import assets as assets_sql
from engine.db.queries import state_store as state_sql
from engine.views import assets as assets_view
from engine.views import partitions as partitions_view
from triggers.base import check_partition_key


@click.group()
def assets() -> None:
    """Assets and their events."""


@assets.command("list")
@json_option
@click.pass_context
def assets_list(ctx: click.Context, as_json: bool) -> None:
    """Every asset with its number of events."""
    listed = run_query(ctx, assets_view.list_assets)["items"]
    columns = ["name", "uri", "events"]
    emit([{k: a[k] for k in columns} for a in listed], columns, as_json)


@assets.command("events")
@click.argument("asset")
@click.option(
    "--partition-key", default=None, metavar="KEY", help="The events of this partition only."
)
@json_option
@click.pass_context
def assets_events(ctx: click.Context, asset: str, partition_key: str | None, as_json: bool) -> None:
    """The events of an asset: their partition key, where they came from, extra and
    payload, the runs they created."""
    listed = run_query(
        ctx,
        lambda s: assets_view.list_asset_events(
            s, asset=asset, partition_key=partition_key, newest_first=False
        ),
    )
    if listed is None:
        fail(f"no asset {asset!r}; see `sluice assets list`")
    columns = ["id", "timestamp", "partition_key", "source", "source_watcher", "source_task"]
    columns += ["created_by", "extra", "payload", "runs"]
    emit([{k: e[k] for k in columns} for e in listed["items"]], columns, as_json)


@assets.command("partitions")
@click.argument("asset")
@click.option(
    "--from",
    "from_text",
    default=None,
    metavar="DATE",
    help="List the keys the producing DAG's CronPartitionTimetable expects from this date "
    "(without an offset: in that DAG's timezone).",
)
@click.option(
    "--to", "to_text", default=None, metavar="DATE", help="... to this date (default: now)."
)
@json_option
@click.pass_context
def assets_partitions(
    ctx: click.Context, asset: str, from_text: str | None, to_text: str | None, as_json: bool
) -> None:
    """The partitions of ASSET, newest key first: each key's events and latest event, and
    for each DAG that runs per key on it, the state of its run for the key (a rollup's: the
    run of the key's day, week...). With --from/--to: the keys its producer's ticks expect
    there, the missing ones marked."""
    if to_text is not None and from_text is None:
        fail("--to needs --from")
    start = end = None
    if from_text is not None:
        zone = timezone_of(run_query(ctx, lambda s: partitions_view.range_timezone(s, asset)))
        start = parse_date(from_text, timezone=zone, option="--from")
        end = (
            models.utcnow()
            if to_text is None
            else parse_date(to_text, timezone=zone, option="--to")
        )

    def read(session: Any) -> partitions_view.AssetPartitions | None:
        return partitions_view.asset_partitions(session, asset, start=start, end=end)

    try:
        shown = run_query(ctx, read)
    except partitions_view.PartitionRangeError as exc:
        fail(str(exc))
    if shown is None:
        fail(f"no asset {asset!r}; see `sluice assets list`")
    if as_json:
        click.echo(json.dumps(shown, indent=2))
    else:
        click.echo(partitions_text.render_text(shown), nl=False)


@assets.command("state")
@click.argument("asset")
@json_option
@click.pass_context
def assets_state(ctx: click.Context, asset: str, as_json: bool) -> None:
    """Print what an asset keeps in its asset state store (``asset_state_store``): each key,
    its JSON value and when it was written."""
    from engine.cli.tasks import STATE_COLUMNS, state_row

    found = run_query(ctx, lambda session: state_sql.asset_state_entries(session, asset=asset))
    if found is None:
        fail(f"no asset named {asset!r} (sluice assets list shows them)")
    emit([state_row(entry) for entry in found], STATE_COLUMNS[:3], as_json)


@assets.command("emit")
@click.argument("asset")
@click.option("--extra", default=None, metavar="JSON", help="JSON object: the event's extra.")
@click.option(
    "--partition-key",
    default=None,
    metavar="KEY",
    help="The slice of the asset the event updated (at most 250 characters).",
)
@json_option
@click.pass_context
def assets_emit(
    ctx: click.Context, asset: str, extra: str | None, partition_key: str | None, as_json: bool
) -> None:
    """Record an event of ASSET, as a watcher would: the DAGs scheduled on it run. Prints the
    event's id."""
    parsed = parse_json_object(extra, "--extra")
    if partition_key is not None:
        try:
            check_partition_key(partition_key, "--partition-key")
        except ValueError as exc:
            fail(str(exc))
    keep = get_config(ctx).scheduler.keep_events_while_paused
    actor = cli_actor()

    def emit_event(session: Any) -> int:
        return assets_sql.emit_asset_event(
            session,
            asset,
            extra=parsed,
            source=assets_sql.SOURCE_CLI,
            created_by=actor,
            partition_key=partition_key,
            keep_while_paused=keep,
        )

    try:
        event_id = run_query(ctx, emit_event, writes=True)
    except assets_sql.UnknownAssetError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps({"asset": asset, "event_id": event_id}))
    else:
        click.echo(f"emitted event {event_id} of asset {asset}")
