"""The SQL of claiming trigger rows: single rows, whole shared-stream groups, repairs.

A row with a ``stream_digest`` belongs to the group of every row with the same digest; the
policy of who takes a group lives in ``engine.triggerer.claiming`` (pure), these functions only read
and write. Group claims run under one fleet-wide lock (``lock_group_claims``): on
PostgreSQL a transaction-scoped advisory lock, on SQLite the database write lock every
transaction already takes (``BEGIN IMMEDIATE``). Rows without a digest are claimed as
before, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, concurrently across triggerers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import (
    Integer,
    Select,
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import aliased

from engine.db.models import Job, Trigger, UtcDateTime, utcnow
from engine.db.queries.jobs import TRIGGERER_JOB
from engine.db.queries.triggers import TRIGGER_ROW_COLUMNS, TriggerRow, ids_in, trigger_row

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import BindParameter, ColumnElement

#: Key of the PostgreSQL advisory lock that serializes shared-stream group claims fleet-wide.
GROUP_CLAIM_LOCK_KEY: Final = 0x51_C1A1
#: The PostgreSQL channel notified (by migration 0018's row triggers) at the commit of a
#: transaction that inserted trigger rows or left rows unassigned.
NEW_TRIGGER_ROWS_CHANNEL: Final = "sluice_trigger_rows"
#: Run on a connection of its own in autocommit mode (``engine.db.listen``).
LISTEN_NEW_TRIGGER_ROWS: Final = f"LISTEN {NEW_TRIGGER_ROWS_CHANNEL}"


def _rows(result: Iterable[Any]) -> list[TriggerRow]:
    return sorted((trigger_row(row) for row in result), key=lambda r: r.id)


def _ids_by_digest(rows: Iterable[Any]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for digest, trigger_id in rows:
        groups[str(digest)].append(int(trigger_id))
    return dict(groups)


@dataclass(frozen=True, slots=True)
class Liveness:
    """Who is alive, and which triggerers that are not still hold rows (read once a round)."""

    alive: frozenset[int]
    dead_owners: tuple[int, ...] = ()


def liveness(session: Session, *, alive: Collection[int]) -> Liveness:
    holds = select(Trigger.id).where(Trigger.triggerer_id == Job.id).exists()
    dead = session.execute(
        select(Job.id).where(Job.job_type == TRIGGERER_JOB, Job.id.not_in(sorted(alive)), holds)
    )
    return Liveness(frozenset(alive), tuple(sorted(int(i) for i in dead.scalars())))


def _free_rows(live: Liveness, *columns: Any) -> list[Select[Any]]:
    """Selects of the rows nobody alive holds: unassigned ones, and those of dead owners.
    Two statements rather than one OR: each then searches the (owner, digest) index."""
    queries = [select(*columns).where(Trigger.triggerer_id.is_(None))]
    if live.dead_owners:
        queries.append(select(*columns).where(Trigger.triggerer_id.in_(live.dead_owners)))
    return queries


def _unowned(live: Liveness) -> ColumnElement[bool]:
    if not live.dead_owners:
        return Trigger.triggerer_id.is_(None)
    return or_(Trigger.triggerer_id.is_(None), Trigger.triggerer_id.in_(live.dead_owners))


def lock_group_claims(session: Session) -> None:
    """Serialize group claims and repairs until the transaction ends (PostgreSQL; SQLite's
    ``BEGIN IMMEDIATE`` already serializes every writing transaction)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": GROUP_CLAIM_LOCK_KEY})


def _claimable_probe(*, has_room: bool) -> Select[Any]:
    """The probe of ``has_claimable_triggers``, built once (it runs ten times a second):
    the triggerer is the bound parameter ``me``."""
    me: BindParameter[int] = bindparam("me", type_=Integer)
    other = aliased(Trigger)
    held_by = select(other.id).where(
        other.stream_digest == Trigger.stream_digest, other.triggerer_id.is_not(None)
    )
    wanted = and_(
        Trigger.stream_digest.is_not(None), held_by.where(other.triggerer_id == me).exists()
    )
    if has_room:
        free = or_(
            Trigger.stream_digest.is_(None), ~held_by.where(other.triggerer_id != me).exists()
        )
        wanted = or_(wanted, free)
    return select(Trigger.id).where(Trigger.triggerer_id.is_(None), wanted).limit(1)


_PROBES: Final = {room: _claimable_probe(has_room=room) for room in (False, True)}


def has_claimable_triggers(session: Session, *, triggerer_id: int, has_room: bool) -> bool:
    """Whether an unassigned row waits that ``triggerer_id`` would take now: one of a group it
    holds (taken even when it is full), or, with room, a single row or a row of a group no
    other triggerer holds. One indexed probe, cheap enough to run every
    ``new_trigger_poll_s``."""
    probe = _PROBES[has_room]
    return session.execute(probe, {"me": triggerer_id}).first() is not None


def claim_single_rows(
    session: Session, *, triggerer_id: int, capacity: int, live: Liveness
) -> list[TriggerRow]:
    """Assign up to ``capacity`` rows without a digest that nobody alive holds."""
    if capacity <= 0:
        return []
    ids: list[int] = []
    postgres = session.get_bind().dialect.name == "postgresql"
    for query in _free_rows(live, Trigger.id):
        query = query.where(Trigger.stream_digest.is_(None)).order_by(Trigger.id).limit(capacity)
        if postgres:
            query = query.with_for_update(skip_locked=True)
        ids += session.execute(query).scalars()
    return assign_rows(session, sorted(ids)[:capacity], triggerer_id=triggerer_id, live=live)


def has_unowned_group_rows(session: Session, *, live: Liveness) -> bool:
    return any(
        session.execute(query.where(Trigger.stream_digest.is_not(None)).limit(1)).first()
        for query in _free_rows(live, Trigger.id)
    )


def unowned_group_rows(session: Session, *, live: Liveness) -> dict[str, list[int]]:
    """digest -> ids (ascending) of the rows with a digest that nobody alive holds."""
    rows: list[Any] = []
    for query in _free_rows(live, Trigger.stream_digest, Trigger.id):
        rows += session.execute(query.where(Trigger.stream_digest.is_not(None))).all()
    return _ids_by_digest(sorted(rows, key=lambda row: row[1]))


def group_holders(
    session: Session, *, digests: Iterable[str] | None, alive: Collection[int]
) -> dict[str, dict[int, int]]:
    """digest -> {live triggerer id: rows it holds} for ``digests`` (None: every digest)."""
    query = select(Trigger.stream_digest, Trigger.triggerer_id, func.count(Trigger.id)).where(
        Trigger.stream_digest.is_not(None), Trigger.triggerer_id.in_(sorted(alive))
    )
    if digests is not None:
        wanted = sorted(set(digests))
        if not wanted:
            return {}
        query = query.where(Trigger.stream_digest.in_(wanted))
    holders: dict[str, dict[int, int]] = defaultdict(dict)
    for digest, triggerer_id, count in session.execute(
        query.group_by(Trigger.stream_digest, Trigger.triggerer_id)
    ):
        holders[str(digest)][int(triggerer_id or 0)] = int(count)  # NOT NULL: IN (...)
    return dict(holders)


def held_digests(session: Session, *, triggerer_id: int) -> set[str]:
    rows = session.execute(
        select(Trigger.stream_digest)
        .where(Trigger.triggerer_id == triggerer_id, Trigger.stream_digest.is_not(None))
        .distinct()
    )
    return {str(d) for d in rows.scalars()}


def triggerer_rooms(session: Session, *, alive: Collection[int]) -> dict[int, int]:
    """Live triggerer id -> its capacity minus the rows it holds (never below 0)."""
    if not alive:
        return {}
    held = (
        select(Trigger.triggerer_id, func.count(Trigger.id).label("held"))
        .where(Trigger.triggerer_id.in_(sorted(alive)))
        .group_by(Trigger.triggerer_id)
        .subquery()
    )
    rows = session.execute(
        select(Job.id, Job.capacity, func.coalesce(held.c.held, 0))
        .outerjoin(held, held.c.triggerer_id == Job.id)
        .where(Job.id.in_(sorted(alive)), Job.job_type == TRIGGERER_JOB)
    )
    return {int(i): max(0, int(cap or 0) - int(n)) for i, cap, n in rows}


def assign_rows(
    session: Session, ids: Iterable[int], *, triggerer_id: int, live: Liveness
) -> list[TriggerRow]:
    """Assign ``ids`` to ``triggerer_id`` where nobody alive (else) holds them yet."""
    wanted = sorted(ids)
    if not wanted:
        return []
    free = or_(_unowned(live), Trigger.triggerer_id == triggerer_id)
    # a row it already holds keeps the time it was first claimed
    now = literal(utcnow(), UtcDateTime())
    kept = func.coalesce(Trigger.claimed_at, now)
    claimed_at = case((Trigger.triggerer_id == triggerer_id, kept), else_=now)
    result = session.execute(
        update(Trigger)
        .where(ids_in(session, Trigger.id, wanted), free)
        .values(triggerer_id=triggerer_id, claimed_at=claimed_at)
        .returning(*TRIGGER_ROW_COLUMNS)
    )
    return _rows(result)


def release_groups(session: Session, *, triggerer_id: int, digests: Iterable[str]) -> list[int]:
    """Unassign the rows of ``digests`` that ``triggerer_id`` holds; returns their ids."""
    wanted = sorted(set(digests))
    if not wanted:
        return []
    result = session.execute(
        update(Trigger)
        .where(Trigger.triggerer_id == triggerer_id, Trigger.stream_digest.in_(wanted))
        .values(triggerer_id=None, claimed_at=None)
        .returning(Trigger.id)
    )
    return sorted(int(i) for i in result.scalars())


def rehome_rows(session: Session, *, triggerer_id: int, digests: Mapping[int, str]) -> None:
    """Record the digest of rows that had none and hand them back, to be claimed with their
    group (rows written before digests existed, or by a path that could not compute one)."""
    for trigger_id, digest in sorted(digests.items()):
        session.execute(
            update(Trigger)
            .where(Trigger.id == trigger_id, Trigger.triggerer_id == triggerer_id)
            .values(stream_digest=digest, triggerer_id=None, claimed_at=None)
        )


def set_stream_digest(session: Session, trigger_id: int, digest: str | None) -> None:
    session.execute(update(Trigger).where(Trigger.id == trigger_id).values(stream_digest=digest))


def stream_splits(session: Session, *, alive: Collection[int]) -> dict[str, dict[int, int]]:
    """Groups held by more than one live triggerer: digest -> {triggerer id: rows}."""
    return {
        d: h for d, h in group_holders(session, digests=None, alive=alive).items() if len(h) > 1
    }


def group_trigger_ids(session: Session, *, digests: Iterable[str]) -> dict[str, list[int]]:
    """digest -> ids of every row of that group, whoever holds them."""
    wanted = sorted(set(digests))
    if not wanted:
        return {}
    rows = session.execute(
        select(Trigger.stream_digest, Trigger.id)
        .where(Trigger.stream_digest.in_(wanted))
        .order_by(Trigger.id)
    )
    return _ids_by_digest(rows)
