"""What ``sluice db clean`` does to keep the metadata database bounded while the engine runs:
its cut-offs, the values of its options, the batches, the dry run's counts, the summary.

Airflow's ``airflow db clean`` is the model (``--clean-before-timestamp``, ``--tables``,
``--dry-run``, ``--yes``, batch size); ours does not archive rows, it deletes them. The SQL is
in ``engine.db.queries.clean``; this module decides the cut-offs, parses the command's values and
runs the batches: each batch is its own short transaction (``Database.call``), with a short
pause between batches so that the engine's writers, which wait on SQLite's single write
lock, get their turn. The command (``engine.cli.db``) is its only caller.

How long a redelivery is recognised: an asset event with a dedup key is the record that
absorbs a redelivered broker message with the same key, for as long as the row exists. ``db
clean`` keeps it at least ``[core] asset_event_dedup_retention_sec`` after it was stored
(default 14 days), even when ``--before`` is more recent; without ``db clean`` nothing ever
deletes it.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Final

from engine.db.queries import clean as store_clean
from engine.db.queries.clean import TABLES, Cutoffs

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from engine.db.database import Database

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE: Final = 1000
#: Pause between two batches: a writer waiting on SQLite's lock gets it before the next batch.
BATCH_PAUSE_S: Final = 0.02
#: A job still marked running goes only after this long without a heartbeat (or the
#: liveness thresholds, if longer): a part that is merely slow (a long first DAG parse before
#: its heartbeats start) must never lose its row.
LONG_DEAD_AFTER_S: Final = 3600.0
_AGE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: What ``--tables`` names and what each one deletes (for the help text and errors).
DESCRIPTIONS: Final = {
    "dag_run": "finished DAG runs, with their task instances",
    "asset_event": "asset events (and their dedup keys) outside the dedup window",
    "trigger": "trigger rows no task and no watcher uses",
    "shared_stream_snapshot": "shared-stream snapshots of dead triggerers",
    "job": "job rows that ended or died, and own nothing",
    "task_state_store": "task state store entries past their retention (whatever --before)",
}


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """What a clean deletes: these tables (in ``TABLES`` order), rows past these cut-offs."""

    tables: tuple[str, ...]
    cutoffs: Cutoffs


def parse_before(value: str, *, now: datetime) -> datetime:
    """``--before``: an ISO 8601 timestamp (naive means UTC) or an age before ``now``
    (``90s``, ``15m``, ``12h``, ``30d``, ``2w``). A time after ``now`` is refused."""
    match = _AGE.match(value)
    if match:
        return now - timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"{value!r} is neither an ISO timestamp (2026-01-31T12:00:00+00:00) "
            "nor an age (90s, 15m, 12h, 30d, 2w)"
        ) from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    if moment > now:
        raise ValueError(f"{value!r} is in the future; give a time before now ({now:%Y-%m-%d})")
    return moment


def parse_tables(value: str | None) -> tuple[str, ...]:
    """``--tables``: comma-separated names of ``TABLES`` (None or empty: all of them)."""
    names = {name.strip() for name in (value or "").split(",") if name.strip()}
    unknown = sorted(names - set(TABLES))
    if unknown:
        raise ValueError(f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    return tuple(t for t in TABLES if t in names) if names else TABLES


def long_dead_after_s(*health_thresholds_s: float) -> float:
    """Heartbeat age after which ``db clean`` treats a job still marked running as dead."""
    return max(LONG_DEAD_AFTER_S, *health_thresholds_s)


def make_plan(
    tables: tuple[str, ...],
    *,
    before: datetime,
    now: datetime,
    dedup_retention_s: float,
    dead_after_s: float,
) -> CleanPlan:
    """The plan for a clean at ``now``: asset events with a dedup key are kept for
    ``dedup_retention_s``; a running job is dead after ``dead_after_s`` without heartbeat."""
    cutoffs = Cutoffs(
        before=before,
        dedup_before=now - timedelta(seconds=dedup_retention_s),
        dead_before=now - timedelta(seconds=dead_after_s),
        now=now,
    )
    return CleanPlan(tables=tables, cutoffs=cutoffs)


def count(db: Database, plan: CleanPlan) -> dict[str, int]:
    """Rows a clean would delete now, per table (``task_instance`` with ``dag_run``)."""
    counts: dict[str, int] = {}
    for table in plan.tables:
        query = partial(store_clean.count_rows, table=table, cutoffs=plan.cutoffs)
        counts.update(db.call(query, read_only=True))
    return counts


def clean(
    db: Database,
    plan: CleanPlan,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pause_s: float = BATCH_PAUSE_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, int]:
    """Delete what the plan allows, ``batch_size`` rows per transaction; rows deleted per
    table. Tables are cleaned in ``TABLES`` order: DAG runs first, which frees their events."""
    deleted: dict[str, int] = {}
    for table in plan.tables:
        for name, rows in _clean_table(db, table, plan.cutoffs, batch_size, pause_s, sleep):
            deleted[name] = deleted.get(name, 0) + rows
    before = plan.cutoffs.before.isoformat()
    logger.info(
        "Database clean deleted %s",
        deleted,
        extra={"action": "db_clean", "deleted": deleted, "before": before},
    )
    return deleted


def _clean_table(
    db: Database,
    table: str,
    cutoffs: Cutoffs,
    batch_size: int,
    pause_s: float,
    sleep: Callable[[float], None],
) -> list[tuple[str, int]]:
    batch = partial(store_clean.delete_batch, table=table, cutoffs=cutoffs, limit=batch_size)
    done: list[tuple[str, int]] = []
    while True:
        counts = db.call(batch)
        done += counts.items()
        logger.debug("Deleted %s", counts, extra={"action": "db_clean_batch", "table": table})
        if counts[table] < batch_size:
            return done
        sleep(pause_s)


def summary_lines(counts: Mapping[str, int], *, dry_run: bool) -> list[str]:
    """One line per table: how many rows were (or, in a dry run, would be) deleted."""
    verb = "would be deleted" if dry_run else "deleted"
    width = max((len(name) for name in counts), default=0)
    return [f"{name:<{width}}  {rows} row(s) {verb}" for name, rows in counts.items()]
