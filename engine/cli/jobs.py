"""``sluice jobs list``: the engine's parts (triggerer, scheduler, executor, ...) and their
heartbeats, from the metadata database (so it works from any host that can reach it).

Liveness uses the configured health thresholds: ``[triggerer] health_check_threshold_s`` for
triggerers, ``[scheduler] health_check_threshold_s`` for every other part.
"""

from __future__ import annotations

from functools import partial

import click

from engine.cli.common import emit, get_config, json_option, run_query
from engine.db.models import utcnow
from engine.views import jobs as jobs_view


@click.group()
def jobs() -> None:
    """Engine parts (triggerer, scheduler, executor) and their heartbeats."""


@jobs.command("list")
@click.option("--all", "include_ended", is_flag=True, help="Include jobs that ended.")
@json_option
@click.pass_context
def jobs_list(ctx: click.Context, include_ended: bool, as_json: bool) -> None:
    """Each job: host and pid, state, heartbeat age, alive?, load / capacity, and the queues
    of a Celery worker (its load: the tries it runs)."""
    query = partial(
        jobs_view.list_jobs, now=utcnow(), config=get_config(ctx), include_ended=include_ended
    )
    columns = ["id", "type", "hostname", "pid", "state", "heartbeat_age_s", "alive", "load"]
    emit(run_query(ctx, query)["items"], [*columns, "capacity", "queues"], as_json)
