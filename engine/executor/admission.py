"""Which scheduled task instances an executor claims: those that fit their pool's open
slots and their run's ``max_active_tasks`` (Airflow 3 counts it per DAG run), in id order.

``claim_task_instances`` (``claim_task_steps``: with each claimed task's DAG file) is the
claim's transaction: it reads through
``engine.db.queries.pools`` (pools locked on PostgreSQL, slots taken, active task
instances per run, the scheduled candidates), decides with the pure functions below, and
moves the admitted ones to ``queued`` (``engine.db.queries.tasks.queue_task_instances``).

A task whose pool does not exist, or is smaller than its ``pool_slots``, stays
``scheduled``; ``PoolWarnings`` (one per executor) says so once per task, pool and problem,
looking every ``WARN_EVERY_S``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final

from engine.db.queries import pools as pools_sql
from engine.db.queries import tasks as tasks_sql
from engine.db.queries.pools import UNLIMITED_SLOTS
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.queries.pools import Candidate, PoolRoom

logger = logging.getLogger(__name__)

#: How many scheduled candidates a claim looks at per free slot (some wait for their pool).
CANDIDATES_PER_SLOT: Final = 4
CANDIDATES_MIN: Final = 64

#: Scheduled tasks that cannot start (missing or too small pool) are looked for this often.
WARN_EVERY_S: Final = 10.0
WARN_ROWS_MAX: Final = 100


def claim_task_instances(
    session: Session,
    *,
    job_id: int,
    limit: int,
    now: datetime,
    warnings: PoolWarnings | None = None,
) -> list[int]:
    """``claim_task_steps``' task instance ids."""
    claimed = claim_task_steps(session, job_id=job_id, limit=limit, now=now, warnings=warnings)
    return [c.ti_id for c in claimed]


def claim_task_steps(
    session: Session,
    *,
    job_id: int,
    limit: int,
    now: datetime,
    warnings: PoolWarnings | None = None,
) -> list[Candidate]:
    """Move up to ``limit`` ``scheduled`` task instances that fit their pool and their run's
    ``max_active_tasks`` to ``queued`` for executor ``job_id``, stamped with their pool and
    slots; returns them (in id order). ``warnings``: the executor's, told about tasks no
    pool admits.

    On PostgreSQL the pool rows are locked for the transaction (claims of all executors
    serialize on them) and the rows ``SKIP LOCKED``: two executors never take the same row;
    on SQLite the ``BEGIN IMMEDIATE`` transaction serializes claims.
    """
    if limit <= 0:
        return []
    if warnings is not None:
        warn_unstartable(session, warnings, now_s=time.monotonic())
    pools = pools_sql.lock_pools(session)
    occupied = occupied_slots(pools, pools_sql.slots_taken(session, pools))
    active = pools_sql.active_per_run(session)
    found = pools_sql.candidates(
        session,
        window=max(limit * CANDIDATES_PER_SLOT, CANDIDATES_MIN),
        full_pools=[name for name, room in pools.items() if is_full(room, occupied.get(name, 0))],
        full_runs=[run for run, (n, cap) in active.items() if n >= cap],
    )
    admitted = admit(found, pools, occupied, active, limit=limit)
    queued = set(tasks_sql.queue_task_instances(session, admitted, job_id=job_id, now=now))
    return sorted((c for c in admitted if c.ti_id in queued), key=lambda c: c.ti_id)


def occupied_slots(
    pools: Mapping[str, PoolRoom], taken: Mapping[tuple[str, str], int]
) -> dict[str, int]:
    """Pool name -> slots occupied now: those of its queued, running and restarting task
    instances, and of its deferred ones where the pool counts them."""
    occupied: dict[str, int] = {}
    for (name, state), slots in taken.items():
        if state != TaskState.DEFERRED or pools[name].include_deferred:
            occupied[name] = occupied.get(name, 0) + slots
    return occupied


def is_full(pool: PoolRoom, occupied: int) -> bool:
    return pool.slots != UNLIMITED_SLOTS and occupied >= pool.slots


def admit(
    candidates: Iterable[Candidate],
    pools: Mapping[str, PoolRoom],
    occupied: Mapping[str, int],
    active: Mapping[int, tuple[int, int]],
    *,
    limit: int,
) -> list[Candidate]:
    """Up to ``limit`` of ``candidates`` (in their order) that fit their pool's open slots
    and their run's ``max_active_tasks`` (``active``: run -> (active task instances, cap)),
    each counting those admitted before it."""
    occupied, active = dict(occupied), dict(active)
    admitted: list[Candidate] = []
    for candidate in candidates:
        if len(admitted) >= limit:
            break
        if _fits(candidate, pools, occupied, active):
            admitted.append(candidate)
            occupied[candidate.pool] = occupied.get(candidate.pool, 0) + candidate.pool_slots
            n, cap = active.get(candidate.dag_run_id, (0, candidate.max_active_tasks))
            active[candidate.dag_run_id] = (n + 1, cap)
    return admitted


def _fits(
    candidate: Candidate,
    pools: Mapping[str, PoolRoom],
    occupied: Mapping[str, int],
    active: Mapping[int, tuple[int, int]],
) -> bool:
    pool = pools[candidate.pool]  # the candidates' pools exist (joined)
    if pool.slots != UNLIMITED_SLOTS:
        if occupied.get(candidate.pool, 0) + candidate.pool_slots > pool.slots:
            return False
    n, cap = active.get(candidate.dag_run_id, (0, candidate.max_active_tasks))
    return n < cap


class PoolWarnings:
    """An executor's warnings about scheduled tasks that wait for a pool that does not exist
    or is smaller than their ``pool_slots``: each (task, pool, problem) said once."""

    def __init__(self) -> None:
        self._warned: set[tuple[str, str, str, str]] = set()
        self._last_looked_s = -float("inf")

    def __repr__(self) -> str:
        return f"<PoolWarnings warned={len(self._warned)}>"

    def is_due(self, now_s: float) -> bool:
        """Whether to look for such tasks now (every ``WARN_EVERY_S``); counts as looking."""
        if now_s - self._last_looked_s < WARN_EVERY_S:
            return False
        self._last_looked_s = now_s
        return True

    def warn(self, found: Iterable[tuple[Candidate, int | None]]) -> None:
        """Warn about each task found (with its pool's size, None: no such pool) not warned
        about before."""
        for candidate, pool_size in found:
            problem = "missing" if pool_size is None else "too_small"
            key = (candidate.dag_id, candidate.task_id, candidate.pool, problem)
            if key not in self._warned:
                self._warned.add(key)
                _log(candidate, pool_size)


def warn_unstartable(session: Session, warnings: PoolWarnings, *, now_s: float) -> None:
    """Let ``warnings`` look for tasks no pool admits, when it is due."""
    if warnings.is_due(now_s):
        warnings.warn(pools_sql.unstartable(session, limit=WARN_ROWS_MAX))


def _log(candidate: Candidate, pool_size: int | None) -> None:
    extra = {"dag_id": candidate.dag_id, "task_id": candidate.task_id, "pool": candidate.pool}
    if pool_size is None:
        logger.warning(
            "Task %s.%s is in pool %r, which does not exist; it stays scheduled until "
            "the pool is created (sluice pools set %s SLOTS)",
            candidate.dag_id,
            candidate.task_id,
            candidate.pool,
            candidate.pool,
            extra={"action": "pool_missing", **extra},
        )
    else:
        logger.warning(
            "Task %s.%s needs %d slots of pool %r, which has only %d; it stays "
            "scheduled until the pool is given more slots",
            candidate.dag_id,
            candidate.task_id,
            candidate.pool_slots,
            candidate.pool,
            pool_size,
            extra={"action": "pool_too_small", **extra},
        )
