"""``sluice triggers list``: the trigger rows, who runs them and what they serve, from the
metadata database (so it works from any host that can reach it). An owner is alive by
``[triggerer] health_check_threshold_s``.
"""

from __future__ import annotations

from functools import partial

import click

from engine.cli.common import emit, get_config, json_option, run_query
from engine.db.models import utcnow
from engine.views import triggers as triggers_view


@click.group()
def triggers() -> None:
    """Trigger rows: who runs them and what they serve."""


@triggers.command("list")
@json_option
@click.pass_context
def triggers_list(ctx: click.Context, as_json: bool) -> None:
    """Each trigger: class, owner triggerer (alive?), age, what it serves, load failure."""
    query = partial(triggers_view.list_triggers, now=utcnow(), config=get_config(ctx))
    rows = [{k: r[k] for k in _TRIGGER_KEYS} for r in run_query(ctx, query)["items"]]
    columns = ["id", "classpath", "triggerer_id", "owner_alive", "age_s", "serves"]
    emit(rows, [*columns, "failures", "last_failure_age_s", "load_failed"], as_json)


#: What ``triggers list --json`` prints of each trigger.
_TRIGGER_KEYS = (
    "id",
    "classpath",
    "kind",
    "triggerer_id",
    "owner_alive",
    "age_s",
    "serves",
    "failures",
    "last_failure_age_s",
    "load_failed",
    "last_error",
)
