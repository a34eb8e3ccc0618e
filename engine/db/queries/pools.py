"""SQL of pools, and which scheduled task instances an executor may start (the admission).

Pools are Airflow's: a name and a number of slots (``-1``: unlimited). A task takes
``pool_slots`` of its ``pool`` (``default_pool`` unless it names another) while it is
``queued`` or ``running``, and while ``deferred`` when its pool has ``include_deferred``.
The executor stamps ``pool`` / ``pool_slots`` on the task instance when it claims it, so an
instance keeps counting against the pool it was started in.

A DAG's ``max_active_tasks`` caps the ``queued`` + ``running`` task instances of each of its
runs (Airflow 3 counts it per DAG run, no longer across the DAG's runs).

Admission (``admit``) runs inside the claim transaction. On PostgreSQL it first locks every
pool row ``FOR UPDATE`` in name order: claims of all executors serialize there, and each
reads the counts only once it holds the locks, so the others' committed claims are in them
(under READ COMMITTED a statement sees what was committed before it started). On SQLite the
``BEGIN IMMEDIATE`` transaction serializes claims already. A task whose pool does not exist
stays ``scheduled``; a warning naming the task and the pool is logged once per process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sqlalchemy import delete, func, insert, or_, select, update

from engine.authoring.sensor_base import RESCHEDULE_METHOD
from engine.db.database import is_postgres
from engine.db.models import DEFAULT_POOL, Dag, DagRun, DagTask, Pool, TaskInstance
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy import Select
    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ColumnElement

logger = logging.getLogger(__name__)

#: A pool of this many slots never fills (Airflow's ``-1``).
UNLIMITED_SLOTS: Final = -1
#: How many scheduled candidates a claim looks at per free slot (some wait for their pool).
CANDIDATES_PER_SLOT: Final = 4
CANDIDATES_MIN: Final = 64

#: States whose task instances hold their pool slots (and count against max_active_tasks): a
#: ``restarting`` one keeps its process until its executor has stopped it.
_ACTIVE: Final = (TaskState.QUEUED, TaskState.RUNNING, TaskState.RESTARTING)

#: Scheduled tasks that cannot start (missing or too small pool) are looked for this often.
WARN_EVERY_S: Final = 10.0
WARN_ROWS_MAX: Final = 100

#: (dag_id, task_id, pool, problem) already warned about: each is said once per process
_warned: set[tuple[str, str, str, str]] = set()
_last_warned_s = -float("inf")


class PoolError(ValueError):
    """A pool cannot be set or deleted as asked (the message says why)."""


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """A pool and the slots its task instances occupy (``sluice pools list``)."""

    name: str
    slots: int
    description: str | None
    include_deferred: bool
    running: int = 0
    queued: int = 0
    deferred: int = 0

    @property
    def occupied(self) -> int:
        return self.running + self.queued + (self.deferred if self.include_deferred else 0)

    @property
    def open(self) -> int | None:
        """Open slots; None for an unlimited pool."""
        return None if self.slots == UNLIMITED_SLOTS else self.slots - self.occupied

    def as_dict(self) -> dict[str, object]:
        return {
            "pool": self.name,
            "slots": self.slots,
            "running": self.running,
            "queued": self.queued,
            "deferred": self.deferred,
            "open": "unlimited" if self.open is None else self.open,
            "include_deferred": self.include_deferred,
            "description": self.description,
        }


# --- pools (the CLI) ------------------------------------------------------------------------


def _slot_counts(
    session: Session, names: Iterable[str] | None = None
) -> dict[tuple[str, str], int]:
    """(pool, state) -> slots the task instances in that state take."""
    query = (
        select(TaskInstance.pool, TaskInstance.state, func.sum(TaskInstance.pool_slots))
        .where(
            TaskInstance.pool.is_not(None),
            TaskInstance.state.in_([*_ACTIVE, TaskState.DEFERRED]),
            # a sensor in reschedule mode between pokes is Airflow's up_for_reschedule,
            # which holds no slot, even in a pool that counts deferred tasks
            or_(
                TaskInstance.next_method.is_(None),
                TaskInstance.next_method != RESCHEDULE_METHOD,
            ),
        )
        .group_by(TaskInstance.pool, TaskInstance.state)
    )
    if names is not None:
        query = query.where(TaskInstance.pool.in_(list(names)))
    return {(str(p), str(s)): int(n or 0) for p, s, n in session.execute(query)}


def _usage(pool: Pool, counts: dict[tuple[str, str], int]) -> PoolUsage:
    return PoolUsage(
        name=pool.name,
        slots=pool.slots,
        description=pool.description,
        include_deferred=pool.include_deferred,
        running=counts.get((pool.name, TaskState.RUNNING), 0)
        + counts.get((pool.name, TaskState.RESTARTING), 0),  # still has its process
        queued=counts.get((pool.name, TaskState.QUEUED), 0),
        deferred=counts.get((pool.name, TaskState.DEFERRED), 0),
    )


def list_pools(session: Session) -> list[PoolUsage]:
    """Every pool with its occupancy, by name."""
    pools = list(session.execute(select(Pool).order_by(Pool.name)).scalars())
    counts = _slot_counts(session)
    return [_usage(pool, counts) for pool in pools]


def get_pool(session: Session, name: str) -> PoolUsage | None:
    pool = session.get(Pool, name)
    return None if pool is None else _usage(pool, _slot_counts(session, [name]))


def check_slots(slots: int) -> int:
    if slots < UNLIMITED_SLOTS:
        raise PoolError(f"pool slots must be >= 0, or -1 for unlimited; got {slots}")
    return slots


def set_pool(
    session: Session,
    name: str,
    *,
    slots: int,
    description: str | None = None,
    include_deferred: bool | None = None,
) -> PoolUsage:
    """Create the pool or change it; a None ``description`` / ``include_deferred`` keeps the
    stored one (a new pool: no description, deferred tasks not counted)."""
    if not name.strip() or len(name) > 256:
        raise PoolError(f"pool name must be 1 to 256 characters, got {name!r}")
    check_slots(slots)
    pool = session.get(Pool, name, with_for_update=True)
    if pool is None:
        session.execute(
            insert(Pool).values(
                name=name,
                slots=slots,
                description=description,
                include_deferred=bool(include_deferred),
            )
        )
    else:
        values: dict[str, object] = {"slots": slots}
        if description is not None:
            values["description"] = description
        if include_deferred is not None:
            values["include_deferred"] = include_deferred
        session.execute(update(Pool).where(Pool.name == name).values(**values))
    session.expire_all()
    usage = get_pool(session, name)
    assert usage is not None
    return usage


def delete_pool(session: Session, name: str) -> bool:
    """Delete a pool (False if there is none). ``default_pool`` cannot be deleted: every task
    that names no pool runs in it."""
    if name == DEFAULT_POOL:
        raise PoolError(f"{DEFAULT_POOL} cannot be deleted (set its slots instead)")
    result = session.execute(delete(Pool).where(Pool.name == name).returning(Pool.name))
    return result.first() is not None


# --- admission (the executor's claim) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A scheduled task instance, with what its admission depends on."""

    ti_id: int
    dag_run_id: int
    dag_id: str
    task_id: str
    pool: str
    pool_slots: int
    max_active_tasks: int


def _lock_pools(session: Session) -> dict[str, Pool]:
    query = select(Pool).order_by(Pool.name)
    if is_postgres(session):
        query = query.with_for_update()
    return {pool.name: pool for pool in session.execute(query).scalars()}


def _occupied(session: Session, pools: dict[str, Pool]) -> dict[str, int]:
    """Pool name -> slots occupied now."""
    counts = _slot_counts(session, pools)
    occupied: dict[str, int] = {}
    for (name, state), slots in counts.items():
        if state != TaskState.DEFERRED or pools[name].include_deferred:
            occupied[name] = occupied.get(name, 0) + slots
    return occupied


def _active_per_run(session: Session) -> dict[int, tuple[int, int]]:
    """Run pk -> (queued + running task instances, its DAG's max_active_tasks)."""
    rows = session.execute(
        select(TaskInstance.dag_run_id, func.count(), Dag.max_active_tasks)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(TaskInstance.state.in_(_ACTIVE))
        .group_by(TaskInstance.dag_run_id, Dag.max_active_tasks)
    )
    return {int(run): (int(n), int(cap)) for run, n, cap in rows}


def _is_full(pool: Pool, occupied: int) -> bool:
    return pool.slots != UNLIMITED_SLOTS and occupied >= pool.slots


def _task_pool() -> tuple[ColumnElement[str], ColumnElement[int]]:
    """A scheduled task instance's pool and slots: its task's (a task gone from its DAG file
    runs in ``default_pool``, one slot)."""
    return func.coalesce(DagTask.pool, DEFAULT_POOL), func.coalesce(DagTask.pool_slots, 1)


def _scheduled() -> Select[int, int, str, str, str, int, int]:
    pool, slots = _task_pool()
    return (
        select(
            TaskInstance.id,
            TaskInstance.dag_run_id,
            TaskInstance.dag_id,
            TaskInstance.task_id,
            pool,
            slots,
            Dag.max_active_tasks,
        )
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .outerjoin(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.state == TaskState.SCHEDULED)
    )


def _candidates(
    session: Session, *, limit: int, full_pools: list[str], full_runs: list[int]
) -> list[Candidate]:
    """Scheduled task instances in id order whose pool exists, is not full and is big enough
    for them, in runs below their ``max_active_tasks``: those that cannot start now are left
    out here, so that they never crowd out of the window those that can."""
    pool, slots = _task_pool()
    query = (
        _scheduled()
        .join(Pool, Pool.name == pool)
        .where((Pool.slots == UNLIMITED_SLOTS) | (slots <= Pool.slots))
        .order_by(TaskInstance.id)
        .limit(max(limit * CANDIDATES_PER_SLOT, CANDIDATES_MIN))
    )
    if full_pools:
        query = query.where(pool.not_in(full_pools))
    if full_runs:
        query = query.where(TaskInstance.dag_run_id.not_in(full_runs))
    if is_postgres(session):
        query = query.with_for_update(skip_locked=True, of=TaskInstance)
    return [Candidate(*row) for row in session.execute(query)]


def warn_unstartable(session: Session, *, now_s: float) -> None:
    """Log once per task a warning for scheduled tasks that wait for a pool that does not
    exist or is smaller than their ``pool_slots`` (looked for every ``WARN_EVERY_S``)."""
    global _last_warned_s
    if now_s - _last_warned_s < WARN_EVERY_S:
        return
    _last_warned_s = now_s
    pool, slots = _task_pool()
    query = (
        _scheduled()
        .outerjoin(Pool, Pool.name == pool)
        .add_columns(Pool.slots)
        .where(Pool.name.is_(None) | ((Pool.slots != UNLIMITED_SLOTS) & (slots > Pool.slots)))
        .limit(WARN_ROWS_MAX)
    )
    for *row, pool_size in session.execute(query):
        candidate = Candidate(*row)
        if pool_size is None:
            _warn_once(
                candidate,
                "missing",
                "Task %s.%s is in pool %r, which does not exist; it stays scheduled until "
                "the pool is created (sluice pools set %s SLOTS)",
                candidate.dag_id,
                candidate.task_id,
                candidate.pool,
                candidate.pool,
            )
        else:
            _warn_once(
                candidate,
                "too_small",
                "Task %s.%s needs %d slots of pool %r, which has only %d; it stays "
                "scheduled until the pool is given more slots",
                candidate.dag_id,
                candidate.task_id,
                candidate.pool_slots,
                candidate.pool,
                pool_size,
            )


def _warn_once(candidate: Candidate, problem: str, message: str, *args: object) -> None:
    key = (candidate.dag_id, candidate.task_id, candidate.pool, problem)
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(
        message,
        *args,
        extra={
            "action": f"pool_{problem}",
            "dag_id": candidate.dag_id,
            "task_id": candidate.task_id,
            "pool": candidate.pool,
        },
    )


def admit(session: Session, *, limit: int) -> list[Candidate]:
    """Up to ``limit`` scheduled task instances that fit their pool and their run's
    ``max_active_tasks`` now, in id order (the caller moves them to ``queued``)."""
    pools = _lock_pools(session)
    occupied = _occupied(session, pools)
    active = _active_per_run(session)
    full_pools = [name for name, pool in pools.items() if _is_full(pool, occupied.get(name, 0))]
    full_runs = [run for run, (n, cap) in active.items() if n >= cap]
    admitted: list[Candidate] = []
    for candidate in _candidates(session, limit=limit, full_pools=full_pools, full_runs=full_runs):
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
    pools: dict[str, Pool],
    occupied: dict[str, int],
    active: dict[int, tuple[int, int]],
) -> bool:
    """Whether the candidate fits its pool's open slots and its run's ``max_active_tasks``,
    counting those admitted before it in this claim."""
    pool = pools[candidate.pool]  # the candidates' pools exist (joined)
    if pool.slots != UNLIMITED_SLOTS:
        if occupied.get(candidate.pool, 0) + candidate.pool_slots > pool.slots:
            return False
    n, cap = active.get(candidate.dag_run_id, (0, candidate.max_active_tasks))
    return n < cap
