"""An asset's partitions as shown (``sluice assets partitions``, ``GET /api/v1/assets/{name}/
partitions``, the partition matrix of the asset's page): which slices of the asset exist,
which are missing, and what each consuming DAG made of them.

- Each partition key of the asset's events, newest key first (keys are compared as text, so
  ISO dates and times come newest first), with its number of events and its latest event.
- With a range of dates (``start``/``end``), the keys a producing DAG on a
  ``CronPartitionTimetable`` expects there: the key of each of its ticks in the range
  (``runs_between`` then ``partition_key_for``, as a backfill of that range makes them),
  each marked ``missing`` when no event carries it. Only the expected keys are listed then.
- For each DAG scheduled on the asset with a ``PartitionedAssetTimetable``, per key: the
  keys the DAG's mapper for the asset gives it (``to_downstream``: a day for an hour under a
  rollup, several under a fan-out, an error for a key it refuses), the state of its latest
  run of those keys, and whether the key's events still wait in its queue (a rollup that
  waits for more hours). Other consumers run on the asset as a whole: listed, no cells.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Final, TypedDict

from engine.authoring.partition_mappers import PartitionKeyError, downstream_keys
from engine.authoring.partition_timetables import (
    CronPartitionTimetable,
    PartitionedAssetTimetable,
)
from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import TimeRestriction, timezone_of, to_utc
from engine.db.queries import backfills, lineage
from engine.db.queries import partitions as partitions_sql
from engine.views.common import check_page, iso

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import tzinfo

    from sqlalchemy.orm import Session

    from engine.authoring.partition_mappers import PartitionMapper
    from engine.authoring.timetables import Timetable
    from engine.db.queries.backfills import DagSchedule

#: The most ticks a range may hold (a year of hourly keys fits).
MAX_EXPECTED_KEYS: Final = 10_000
#: Which state a cell of several runs (a fan-out's) shows: the first of these any run has.
_STATE_ORDER: Final = ("failed", "running", "queued", "success")


class PartitionRangeError(ValueError):
    """A range of dates the asset's partitions cannot be listed for (says why)."""


class KeyEvent(TypedDict):
    id: int
    timestamp: str
    source: str | None


class ConsumerCell(TypedDict):
    """What one partitioned consumer made of one key of the asset."""

    dag_id: str
    downstream_keys: list[str]  # the keys its mapper gives (a rollup's day, a fan-out's keys)
    state: str | None  # of its latest run of those keys (the worst of several); None: no run
    run_id: str | None  # that run (a fan-out's: the run of its first key that has one)
    runs: int  # its runs of those keys
    waiting: bool  # an event of this key is queued for it, not consumed by a run yet
    error: str | None  # the mapper refuses the key (the scheduler drops such events)


class PartitionRow(TypedDict):
    partition_key: str
    expected: bool | None  # a tick's key of a producer in the range (None: no range asked)
    missing: bool  # expected, and no event carries it
    events: int
    last_event: KeyEvent | None
    consumers: list[ConsumerCell]


class ConsumerShown(TypedDict):
    dag_id: str
    partitioned: bool  # on a PartitionedAssetTimetable: it runs per key
    mapper: str | None  # its mapper for this asset
    error: str | None  # its stored schedule cannot be read


class ProducerShown(TypedDict):
    dag_id: str
    timetable: str | None  # the summary of its CronPartitionTimetable


class RangeShown(TypedDict):
    start: str
    end: str
    expected: int  # keys the producers' ticks in the range expect
    missing: int  # of them, keys no event carries


class AssetPartitions(TypedDict):
    """``asset_partitions``: a page of keys (``items``, ``total``, ``limit``, ``offset``)."""

    asset: str
    unkeyed_events: int  # events without a partition key
    consumers: list[ConsumerShown]
    producers: list[ProducerShown]  # the producing DAGs on a CronPartitionTimetable
    range: RangeShown | None
    items: list[PartitionRow]
    total: int
    limit: int | None
    offset: int


def asset_partitions(
    session: Session,
    name: str,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> AssetPartitions | None:
    """The asset's partitions (see the module doc), None for an unknown asset. ``start`` /
    ``end``: list the keys its producers' ticks expect in that range (``end`` alone is
    refused; the caller gives ``end`` = now for ``start`` alone). Raises
    ``PartitionRangeError`` for a range it cannot list."""
    check_page(limit, offset)
    asset = lineage.asset_by_name(session, name)
    if asset is None:
        return None
    consumer_ids = lineage.asset_consumers(session, [asset.id]).get(asset.id, [])
    producer_ids = _producer_ids(session, name)
    schedules = backfills.dag_schedules(session, [*consumer_ids, *producer_ids])
    consumers = [_consumer(schedules.get(d), d, name) for d in consumer_ids]
    producers = _cron_producers(schedules, producer_ids)
    shown_range: RangeShown | None = None
    if start is None and end is None:
        keyed, total = partitions_sql.key_events(session, asset.id, limit=limit, offset=offset)
        rows = [_row(k.partition_key, k, expected=None) for k in keyed]
    else:
        expected = _expected_keys(schedules, producers, start, end)
        rows, shown_range = _range_rows(session, asset.id, expected, (start, end), limit, offset)
        total = len(expected)
    _fill_cells(session, asset.id, rows, consumers)
    return {
        "asset": name,
        "unkeyed_events": partitions_sql.unkeyed_event_count(session, asset.id),
        "consumers": [shown for shown, _ in consumers],
        "producers": [shown for shown, _ in producers],
        "range": shown_range,
        "items": rows,
        "total": total,
        "limit": limit,
        "offset": offset,
    }


def _producer_ids(session: Session, name: str) -> list[str]:
    """The DAGs with a task that has the asset as an outlet."""
    return sorted({d for d, _, outlets, _ in lineage.task_outlets(session) if name in outlets})


def _range_rows(
    session: Session,
    asset_id: int,
    expected: list[str],
    bounds: tuple[datetime | None, datetime | None],
    limit: int | None,
    offset: int,
) -> tuple[list[PartitionRow], RangeShown]:
    """The page of the expected keys (newest first), each with its events, and the range's
    counts."""
    known = (
        partitions_sql.events_between(session, asset_id, expected[-1], expected[0])
        if expected
        else {}
    )
    shown = expected[offset:] if limit is None else expected[offset : offset + limit]
    summary: RangeShown = {
        "start": iso(bounds[0]) or "",
        "end": iso(bounds[1]) or "",
        "expected": len(expected),
        "missing": sum(1 for key in expected if key not in known),
    }
    return [_row(key, known.get(key), expected=True) for key in shown], summary


def range_timezone(session: Session, name: str) -> str:
    """The timezone a range of dates without an offset is read in: that of the first DAG
    on a ``CronPartitionTimetable`` that updates the asset (as its backfill reads dates),
    else UTC."""
    producer_ids = _producer_ids(session, name)
    schedules = backfills.dag_schedules(session, producer_ids)
    for shown, _ in _cron_producers(schedules, producer_ids):
        return schedules[shown["dag_id"]].timezone
    return "UTC"


def read_range(
    session: Session, name: str, start: str | None, end: str | None, *, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """A range typed as text (ISO dates; without an offset in ``range_timezone``; no end:
    ``now``) as aware UTC datetimes; (None, None) when no start is given.
    PartitionRangeError for a date that cannot be read."""
    if not start:
        if end:
            raise PartitionRangeError("a range needs its start; its end defaults to now")
        return None, None
    zone = timezone_of(range_timezone(session, name))
    return _read_date(start, zone, "start"), _read_date(end, zone, "end") if end else now


def _read_date(text: str, zone: tzinfo, name: str) -> datetime:
    try:
        return to_utc(
            datetime.fromisoformat(text.strip()), timezone=zone, where="the range", name=name
        )
    except (ValueError, OverflowError) as exc:  # OverflowError: no UTC for 0001-01-01+01:00
        raise PartitionRangeError(
            f"the range's {name} {text!r} is not an ISO date or datetime (e.g. 2026-03-10, "
            f"2026-03-10T06:00): {exc}"
        ) from exc


def _timetable(sched: DagSchedule | None) -> tuple[Timetable | None, str | None]:
    if sched is None or sched.timetable is None:
        return None, None
    try:
        return timetable_from_json(sched.timetable), None
    except ValueError as exc:
        return None, f"cannot read its stored schedule: {exc}"


def _consumer(
    sched: DagSchedule | None, dag_id: str, asset: str
) -> tuple[ConsumerShown, PartitionMapper | None]:
    timetable, error = _timetable(sched)
    mapper = (
        timetable.mapper_for(asset) if isinstance(timetable, PartitionedAssetTimetable) else None
    )
    shown: ConsumerShown = {
        "dag_id": dag_id,
        "partitioned": mapper is not None,
        "mapper": None if mapper is None else repr(mapper),
        "error": error,
    }
    return shown, mapper


def _cron_producers(
    schedules: dict[str, DagSchedule], producer_ids: Sequence[str]
) -> list[tuple[ProducerShown, CronPartitionTimetable]]:
    out: list[tuple[ProducerShown, CronPartitionTimetable]] = []
    for dag_id in producer_ids:
        sched = schedules.get(dag_id)
        timetable, _ = _timetable(sched)
        if sched is not None and isinstance(timetable, CronPartitionTimetable):
            out.append(({"dag_id": dag_id, "timetable": sched.timetable_summary}, timetable))
    return out


def _expected_keys(
    schedules: dict[str, DagSchedule],
    producers: list[tuple[ProducerShown, CronPartitionTimetable]],
    start: datetime | None,
    end: datetime | None,
) -> list[str]:
    """The keys the producers' ticks in ``[start, end]`` give, newest key first."""
    if start is None or end is None:
        raise PartitionRangeError("a range needs its start (--from); its end defaults to now")
    if end < start:
        raise PartitionRangeError(f"the range ends ({iso(end)}) before it starts ({iso(start)})")
    if not producers:
        raise PartitionRangeError(
            "no DAG on a CronPartitionTimetable updates this asset (a task outlet), so no "
            "keys are expected in a range; list its keys without --from/--to"
        )
    keys: set[str] = set()
    for shown, timetable in producers:
        sched = schedules[shown["dag_id"]]
        restriction = TimeRestriction(sched.start_date, sched.end_date, sched.catchup)
        infos = timetable.runs_between(start, end, restriction=restriction)
        if len(infos) + len(keys) > MAX_EXPECTED_KEYS:
            raise PartitionRangeError(
                f"the range holds more than {MAX_EXPECTED_KEYS} ticks of "
                f"{shown['dag_id']}'s {shown['timetable']}: ask for a shorter one"
            )
        keys.update(key for info in infos if (key := timetable.partition_key_for(info)))
    return sorted(keys, reverse=True)


def _row(
    key: str, events: partitions_sql.KeyEvents | None, *, expected: bool | None
) -> PartitionRow:
    last: KeyEvent | None = None
    if events is not None:
        last = {
            "id": events.last_event_id,
            "timestamp": events.last_event_at.isoformat(),
            "source": events.last_event_source,
        }
    return {
        "partition_key": key,
        "expected": expected,
        "missing": bool(expected) and events is None,
        "events": 0 if events is None else events.count,
        "last_event": last,
        "consumers": [],
    }


def _fill_cells(
    session: Session,
    asset_id: int,
    rows: list[PartitionRow],
    consumers: list[tuple[ConsumerShown, PartitionMapper | None]],
) -> None:
    """Each row's cell per partitioned consumer."""
    keys = [row["partition_key"] for row in rows]
    for shown, mapper in consumers:
        if mapper is None:
            continue
        dag_id = shown["dag_id"]
        mapped: dict[str, tuple[str, ...] | str] = {}
        for key in keys:
            try:
                mapped[key] = downstream_keys(mapper, key)
            except PartitionKeyError as exc:
                mapped[key] = str(exc)
        wanted = {k for m in mapped.values() if not isinstance(m, str) for k in m}
        runs = partitions_sql.runs_of_keys(session, dag_id, wanted)
        waiting = partitions_sql.queued_keys(session, dag_id, asset_id, keys)
        for row in rows:
            key = row["partition_key"]
            row["consumers"].append(_cell(dag_id, mapped[key], runs, waiting=key in waiting))


def _cell(
    dag_id: str,
    mapped: tuple[str, ...] | str,
    runs: dict[str, partitions_sql.KeyRun],
    *,
    waiting: bool,
) -> ConsumerCell:
    if isinstance(mapped, str):
        return {"dag_id": dag_id, "downstream_keys": [], "state": None, "run_id": None,
                "runs": 0, "waiting": False, "error": mapped}  # fmt: skip
    found = [runs[k] for k in mapped if k in runs]
    state: str | None = None
    if found and len(found) == len(mapped):
        states = {r.state for r in found}
        state = next((s for s in _STATE_ORDER if s in states), found[0].state)
    return {
        "dag_id": dag_id,
        "downstream_keys": list(mapped),
        "state": state,
        "run_id": found[0].run_id if found else None,
        "runs": sum(r.runs for r in found),
        "waiting": waiting,
        "error": None,
    }
