"""Who claims which trigger rows: one live owner per shared-stream key, fleet-wide.

Theory of operation. Sibling event triggers with equal ``shared_stream_key()`` share one
upstream consumer; two triggerers each serving part of such a group would be two consumers
of one upstream, each acknowledging what only its own subscribers saw. So every trigger row
carries the digest of its key (``stream_digest``, written with the row, or recorded by the
first triggerer that loads a row without one), and rows are claimed by *group*:

- A row of a group this triggerer holds is taken at once, even beyond capacity (a watcher
  added later joins the running group).
- A row of a group another live triggerer holds is left for that triggerer.
- A group nobody alive holds (new, released at shutdown, or of a dead triggerer) is taken
  whole when it fits in the remaining capacity (capacity minus what runs, the same measure
  for every triggerer; a round's chunk limit applies to single rows only). One that does
  not fit is left for a live triggerer with room for all of it; when no triggerer has that
  much room, the triggerer with the most room (the lowest job id among equals) takes it
  whole, over its capacity, and says so in a warning. A group is never split; it waits only
  while every live triggerer is full or for the one it was left to. A triggerer that is
  shutting down writes capacity 0 to its job row: it has no room.
- A group found held by two live triggerers (a race with a triggerer of an older version,
  rows edited by hand) is repaired: every holder but the one with the most rows of it (the
  lowest job id among equals) unassigns its rows, which its designated owner then takes.

Rows without a digest are claimed one by one with what capacity is left. The decisions are
pure functions of what the round read (``plan_group_claims``); ``claim_round`` reads, plans
and writes in the caller's transaction, group decisions under the fleet-wide group lock.

A triggerer's round is two transactions: ``prepare_round`` (timed-out deferrals, load errors
cleared, rows handed back to their group), then ``sync_round`` (``claim_round``, and the
rows this triggerer owns when they are not what it runs). The first is skipped when a read
finds it has nothing to do (``round_needs_prepare``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.db.queries import claims as store_claims
from engine.db.queries import deferrals, jobs
from engine.db.queries import triggers as trigger_rows

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Set
    from datetime import datetime

    from sqlalchemy.orm import Session


logger = logging.getLogger(__name__)


def designated_owner(holders: Mapping[int, int]) -> int:
    """Of a split group's live holders (id -> rows held), the one that keeps it."""
    return min(holders, key=lambda t: (-holders[t], t))


@dataclass(frozen=True, slots=True)
class Oversized:
    digest: str
    size: int
    capacity_left: int


@dataclass(slots=True)
class GroupPlan:
    take: list[int] = field(default_factory=list)  # row ids to assign to this triggerer
    release: list[str] = field(default_factory=list)  # digests of split groups to let go
    oversized: list[Oversized] = field(default_factory=list)  # taken over capacity
    left: int = 0  # capacity left for single rows


def plan_group_claims(
    *,
    me: int,
    unowned: Mapping[str, list[int]],
    holders: Mapping[str, Mapping[int, int]],
    left: int,
    rooms: Mapping[int, int],
) -> GroupPlan:
    """Decide one round (see the module docstring).

    ``unowned``: digest -> ids of rows nobody alive holds; ``holders``: digest -> {live
    triggerer: rows held}, for the digests of ``unowned`` and those ``me`` holds; ``left``:
    ``me``'s capacity left; ``rooms``: every live triggerer's room (``me``'s included).
    """
    plan = GroupPlan(left=left)
    for digest, held in sorted(holders.items()):
        if me in held and len(held) > 1 and designated_owner(held) != me:
            plan.release.append(digest)
    rooms = {**rooms, me: left}
    for digest, ids in sorted(unowned.items(), key=lambda item: item[1][0]):
        held = holders.get(digest, {})
        if digest in plan.release or (held and me not in held):
            continue
        if me in held:
            plan.take += ids  # joins a group this triggerer runs: never split it
        elif len(ids) <= plan.left:
            plan.take += ids
        elif _takes_oversized(me, len(ids), rooms):
            plan.take += ids
            plan.oversized.append(Oversized(digest, len(ids), plan.left))
        else:
            continue
        plan.left = max(0, plan.left - len(ids))
        rooms[me] = plan.left
    return plan


def _takes_oversized(me: int, size: int, rooms: Mapping[int, int]) -> bool:
    if rooms.get(me, 0) <= 0:
        return False
    if any(room >= size for t, room in rooms.items() if t != me):
        return False  # a triggerer with room for all of it takes it
    return min(rooms, key=lambda t: (-rooms[t], t)) == me


@dataclass(slots=True)
class ClaimResult:
    rows: list[trigger_rows.TriggerRow]
    released: list[int]  # row ids of split groups given up to their designated owner
    oversized: list[Oversized]
    holds_groups: bool  # whether the triggerer now holds rows of any group


def claim_round(
    session: Session,
    *,
    triggerer_id: int,
    capacity_left: int,
    threshold_s: float,
    single_limit: int | None = None,
    now: datetime | None = None,
) -> ClaimResult:
    """Claim whole groups, then single rows, for ``triggerer_id`` (one transaction).

    ``capacity_left``: the triggerer's room, the same measure as every other triggerer's
    (capacity minus what it runs); ``single_limit``: at most this many single rows this
    round (a group is never cut to a round's size).
    """
    me = triggerer_id
    live = _liveness(session, me=me, threshold_s=threshold_s, now=now)
    mine = store_claims.held_digests(session, triggerer_id=me)
    plan = GroupPlan(left=capacity_left)
    if mine or store_claims.has_unowned_group_rows(session, live=live):
        plan, live = _plan_locked(
            session, me=me, mine=mine, live=live, left=capacity_left, fresh=(threshold_s, now)
        )
    released = store_claims.release_groups(session, triggerer_id=me, digests=plan.release)
    # The dead owners' job ids are over: resumed, such a triggerer finds its job row ended
    # (its heartbeat, and the guard of its next store) before it can store or advance more.
    jobs.revoke_jobs(session, live.dead_owners)
    rows = store_claims.assign_rows(session, plan.take, triggerer_id=me, live=live)
    singles = plan.left if single_limit is None else min(plan.left, single_limit)
    rows += store_claims.claim_single_rows(session, triggerer_id=me, capacity=singles, live=live)
    holds = bool(mine - set(plan.release)) or any(r.stream_digest for r in rows)
    return ClaimResult(rows, released, plan.oversized, holds)


def _liveness(
    session: Session, *, me: int, threshold_s: float, now: datetime | None
) -> store_claims.Liveness:
    alive = set(
        jobs.alive_job_ids(session, job_type=jobs.TRIGGERER_JOB, threshold_s=threshold_s, now=now)
    )
    alive.add(me)
    return store_claims.liveness(session, alive=alive)


def _plan_locked(
    session: Session,
    *,
    me: int,
    mine: set[str],
    live: store_claims.Liveness,
    left: int,
    fresh: tuple[float, datetime | None],
) -> tuple[GroupPlan, store_claims.Liveness]:
    if not store_claims.has_unowned_group_rows(session, live=live) and not _may_be_split(
        session, mine, live.alive
    ):
        return GroupPlan(left=left), live
    store_claims.lock_group_claims(session)
    # Everything the plan reads is read again under the lock: another triggerer may have
    # started, claimed a group or died while this one waited for it.
    live = _liveness(session, me=me, threshold_s=fresh[0], now=fresh[1])
    unowned = store_claims.unowned_group_rows(session, live=live)
    holders = store_claims.group_holders(session, digests=set(unowned) | mine, alive=live.alive)
    rooms = store_claims.triggerer_rooms(session, alive=live.alive) if unowned else {}
    plan = plan_group_claims(me=me, unowned=unowned, holders=holders, left=left, rooms=rooms)
    return plan, live


def _may_be_split(session: Session, mine: set[str], alive: Collection[int]) -> bool:
    holders = store_claims.group_holders(session, digests=mine, alive=alive)
    return any(len(held) > 1 for held in holders.values())


def round_needs_prepare(
    session: Session, *, recovered: Collection[int], rehome: Mapping[int, str]
) -> bool:
    """Whether ``prepare_round`` has work (a read): rows to clear or hand back, or a deferral
    past its timeout. Most rounds have none, and skip its write transaction (on SQLite the
    database's one write lock, which the executor's and scheduler's writes queue behind)."""
    return bool(recovered or rehome) or deferrals.has_timed_out_deferrals(session)


def prepare_round(
    session: Session, *, triggerer_id: int, recovered: Collection[int], rehome: Mapping[int, str]
) -> None:
    """The first transaction of a round: fail timed-out deferrals, clear the load errors of
    the ``recovered`` rows, hand the ``rehome`` rows back to their group (id -> digest)."""
    # Its own transaction: it locks task instances and deletes trigger rows, and a claim
    # (which may wait for the fleet-wide group lock, then locks trigger rows) must not hold
    # those locks meanwhile, nor claim a row deleted here.
    deferrals.fail_timed_out_deferrals(session)
    trigger_rows.clear_load_errors(session, recovered)
    store_claims.rehome_rows(session, triggerer_id=triggerer_id, digests=rehome)


@dataclass(slots=True)
class SyncRound:
    claim: ClaimResult  # its rows: those claimed, and the ``retry`` rows still owned
    owned: set[int] | None  # every row the triggerer owns; None when it runs just those
    served: dict[int, trigger_rows.Served]  # what each row of ``claim.rows`` serves


def sync_round(
    session: Session,
    *,
    triggerer_id: int,
    capacity_left: int,
    single_limit: int,
    threshold_s: float,
    expected: tuple[int, int],
    retry: Set[int],
) -> SyncRound:
    """The second transaction of a round: claim, and check what the triggerer owns.

    ``expected``: (how many, sum of the ids) of the rows it runs or failed to load, the
    checksum the owned rows are compared with (no set of a million ids built every round);
    ``retry``: failed ones to load again (fetched again while still owned).
    """
    result = claim_round(
        session,
        triggerer_id=triggerer_id,
        capacity_left=capacity_left,
        single_limit=single_limit,
        threshold_s=threshold_s,
    )
    # The full id list only when the cheap checksum says ours changed: with 100,000 idle
    # triggers, listing them every second is most of the idle CPU.
    claimed = {row.id for row in result.rows}
    local = (expected[0] + len(claimed), expected[1] + sum(claimed))
    owned = None
    if (
        retry
        or result.released
        or trigger_rows.owned_checksum(session, triggerer_id=triggerer_id) != local
    ):
        owned = trigger_rows.owned_trigger_ids(session, triggerer_id=triggerer_id)
        result.rows += trigger_rows.fetch_trigger_rows(session, (retry & owned) - claimed)
    return SyncRound(
        result, owned, trigger_rows.triggers_served(session, (r.id for r in result.rows))
    )
