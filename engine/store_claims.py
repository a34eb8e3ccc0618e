"""The SQL of claiming trigger rows: single rows, whole shared-stream groups, repairs.

A row with a ``stream_digest`` belongs to the group of every row with the same digest; the
policy of who takes a group lives in ``engine.claiming`` (pure), these functions only read
and write. Group claims run under one fleet-wide lock (``lock_group_claims``): on
PostgreSQL a transaction-scoped advisory lock, on SQLite the database write lock every
transaction already takes (``BEGIN IMMEDIATE``). Rows without a digest are claimed as
before, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, concurrently across triggerers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, func, or_, select, text, true, update
from sqlalchemy.orm import aliased

from engine.models import Job, Trigger
from engine.store import TRIGGER_ROW_COLUMNS, TRIGGERER_JOB, TriggerRow

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ColumnElement

#: Key of the PostgreSQL advisory lock that serializes shared-stream group claims fleet-wide.
GROUP_CLAIM_LOCK_KEY: Final = 0x51_C1A1


def _rows(result: Iterable[Any]) -> list[TriggerRow]:
    return sorted((TriggerRow(*row) for row in result), key=lambda r: r.id)


def _ids_by_digest(rows: Iterable[Any]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for digest, trigger_id in rows:
        groups[str(digest)].append(int(trigger_id))
    return dict(groups)


def _unowned(alive: Collection[int]) -> ColumnElement[bool]:
    """Rows nobody alive holds: unassigned, or assigned to a triggerer not in ``alive``."""
    if not alive:
        return true()
    return or_(Trigger.triggerer_id.is_(None), Trigger.triggerer_id.not_in(sorted(alive)))


def lock_group_claims(session: Session) -> None:
    """Serialize group claims and repairs until the transaction ends (PostgreSQL; SQLite's
    ``BEGIN IMMEDIATE`` already serializes every writing transaction)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": GROUP_CLAIM_LOCK_KEY})


def has_claimable_triggers(session: Session, *, triggerer_id: int, has_room: bool) -> bool:
    """Whether an unassigned row waits that ``triggerer_id`` would take now: one of a group it
    holds (taken even when it is full), or, with room, a single row or a row of a group no
    other triggerer holds. One probe, cheap enough to run every ``new_trigger_poll_s``."""
    other = aliased(Trigger)
    held_by = select(other.id).where(
        other.stream_digest == Trigger.stream_digest, other.triggerer_id.is_not(None)
    )
    joins_mine = and_(
        Trigger.stream_digest.is_not(None),
        held_by.where(other.triggerer_id == triggerer_id).exists(),
    )
    wanted = joins_mine
    if has_room:
        free = or_(
            Trigger.stream_digest.is_(None),
            ~held_by.where(other.triggerer_id != triggerer_id).exists(),
        )
        wanted = or_(joins_mine, free)
    probe = select(Trigger.id).where(Trigger.triggerer_id.is_(None), wanted).limit(1)
    return session.execute(probe).first() is not None


def claim_single_rows(
    session: Session, *, triggerer_id: int, capacity: int, alive: Collection[int]
) -> list[TriggerRow]:
    """Assign up to ``capacity`` rows without a digest that nobody alive holds."""
    if capacity <= 0:
        return []
    candidates = (
        select(Trigger.id)
        .where(Trigger.stream_digest.is_(None), _unowned(alive))
        .order_by(Trigger.id)
        .limit(capacity)
    )
    if session.get_bind().dialect.name == "postgresql":
        candidates = candidates.with_for_update(skip_locked=True)
    ids = list(session.execute(candidates).scalars())
    return assign_rows(session, ids, triggerer_id=triggerer_id, alive=alive)


def has_unowned_group_rows(session: Session, *, alive: Collection[int]) -> bool:
    probe = select(Trigger.id).where(Trigger.stream_digest.is_not(None), _unowned(alive))
    return session.execute(probe.limit(1)).first() is not None


def unowned_group_rows(session: Session, *, alive: Collection[int]) -> dict[str, list[int]]:
    """digest -> ids (ascending) of the rows with a digest that nobody alive holds."""
    rows = session.execute(
        select(Trigger.stream_digest, Trigger.id)
        .where(Trigger.stream_digest.is_not(None), _unowned(alive))
        .order_by(Trigger.id)
    )
    return _ids_by_digest(rows)


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
    session: Session, ids: Iterable[int], *, triggerer_id: int, alive: Collection[int]
) -> list[TriggerRow]:
    """Assign ``ids`` to ``triggerer_id`` where nobody alive (else) holds them yet."""
    wanted = sorted(ids)
    if not wanted:
        return []
    free = or_(_unowned(alive), Trigger.triggerer_id == triggerer_id)
    result = session.execute(
        update(Trigger)
        .where(Trigger.id.in_(wanted), free)
        .values(triggerer_id=triggerer_id)
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
        .values(triggerer_id=None)
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
            .values(stream_digest=digest, triggerer_id=None)
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
