"""``sluice streams list``: the shared-stream groups of the live triggerers, from the
snapshots they store in the metadata database (so it works from any host that can reach it).
"""

from __future__ import annotations

from functools import partial

import click

from engine.cli.common import emit, get_config, json_option, run_query
from engine.db.models import utcnow
from engine.views import streams as streams_view


def _lanes(value: dict[str, int]) -> str:
    return " ".join(f"{lane}={count}" for lane, count in value.items()) or "-"


@click.group()
def streams() -> None:
    """Shared-stream groups of the live triggerers."""


@streams.command("list")
@json_option
@click.pass_context
def streams_list(ctx: click.Context, as_json: bool) -> None:
    """Each group: the broker it reads, mode, subscribers, lanes with a backlog and the backlog
    per lane and in all, oldest unresolved event, counters (dead-lettered events among them)."""
    query = partial(
        streams_view.list_stream_groups, now=utcnow(), config=get_config(ctx), history=False
    )
    rows = [{k: r[k] for k in _STREAM_KEYS} for r in run_query(ctx, query)["items"]]
    if not as_json:
        rows = [{**r, "outstanding_by_lane": _lanes(r["outstanding_by_lane"])} for r in rows]
    columns = [
        "triggerer_id",
        "broker",
        "key",
        "mode",
        "subscribers",
        "lanes",
        "outstanding_by_lane",
        "outstanding",
        "oldest_unresolved_age_s",
        "advances",
        "last_advance_batch",
        "overflows",
        "ack_timeouts",
        "rejects",
        "dead_lettered",
        "snapshot_age_s",
    ]
    emit(rows, columns, as_json)


#: What ``streams list --json`` prints of each group.
_STREAM_KEYS = (
    "triggerer_id",
    "broker",
    "key",
    "mode",
    "subscribers",
    "lanes",
    "outstanding_by_lane",
    "outstanding",
    "oldest_unresolved_age_s",
    "queue_high_water",
    "events_polled",
    "deliveries",
    "advances",
    "advanced_events",
    "last_advance_batch",
    "advance_latency_sum_s",
    "overflows",
    "ack_timeouts",
    "rejects",
    "dead_lettered",
    "snapshot_age_s",
)
