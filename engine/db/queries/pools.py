"""SQL of pools, and what an executor's claim reads to decide which scheduled task
instances it may start (``engine.executor.admission`` decides).

Pools are Airflow's: a name and a number of slots (``-1``: unlimited). A task takes
``pool_slots`` of its ``pool`` (``default_pool`` unless it names another) while it is
``queued`` or ``running``, and while ``deferred`` when its pool has ``include_deferred``.
The executor stamps ``pool`` / ``pool_slots`` on the task instance when it claims it, so an
instance keeps counting against the pool it was started in.

The claim's reads run inside the claim transaction. On PostgreSQL ``lock_pools`` locks
every pool row ``FOR UPDATE`` in name order: claims of all executors serialize there, and
each reads the counts only once it holds the locks, so the others' committed claims are in
them (under READ COMMITTED a statement sees what was committed before it started). On
SQLite the ``BEGIN IMMEDIATE`` transaction serializes claims already.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Final

from sqlalchemy import bindparam, delete, func, insert, or_, select, update

from engine.authoring.callbacks import DEFAULT_POOL
from engine.authoring.sensor_base import RESCHEDULE_METHOD
from engine.db.database import is_postgres, read_rows
from engine.db.models import Dag, DagRun, DagTask, Pool, TaskInstance
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy import Select
    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ColumnElement

#: A pool of this many slots never fills (Airflow's ``-1``).
UNLIMITED_SLOTS: Final = -1

#: States whose task instances hold their pool slots (and count against max_active_tasks): a
#: ``restarting`` one keeps its process until its executor has stopped it.
_ACTIVE: Final = (TaskState.QUEUED, TaskState.RUNNING, TaskState.RESTARTING)


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


_SLOTS_TAKEN = (
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
_SLOTS_TAKEN_OF = _SLOTS_TAKEN.where(TaskInstance.pool.in_(bindparam("names", expanding=True)))


def slots_taken(session: Session, names: Iterable[str] | None = None) -> dict[tuple[str, str], int]:
    """(pool, state) -> slots the task instances in that state take (queued, running,
    restarting, deferred), of every pool or of the named ones."""
    if names is None:
        rows = read_rows(session, _SLOTS_TAKEN)
    else:
        rows = read_rows(session, _SLOTS_TAKEN_OF, {"names": list(names)})
    return {(str(p), str(s)): int(n or 0) for p, s, n in rows}


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
    counts = slots_taken(session)
    return [_usage(pool, counts) for pool in pools]


def get_pool(session: Session, name: str) -> PoolUsage | None:
    pool = session.get(Pool, name)
    return None if pool is None else _usage(pool, slots_taken(session, [name]))


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


# --- what the executor's claim reads (engine.executor.admission) -----------------------------


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
    #: its DAG's file (what the task process imports)
    fileloc: str = ""


@dataclass(frozen=True, slots=True)
class PoolRoom:
    """A pool's size and whether its deferred task instances take slots."""

    slots: int
    include_deferred: bool


_POOLS = select(Pool.name, Pool.slots, Pool.include_deferred).order_by(Pool.name)
_POOLS_LOCKED = _POOLS.with_for_update()


def lock_pools(session: Session) -> dict[str, PoolRoom]:
    """Every pool by name; on PostgreSQL its row locked for the transaction."""
    query = _POOLS_LOCKED if is_postgres(session) else _POOLS
    return {
        str(name): PoolRoom(int(slots), bool(include_deferred))
        for name, slots, include_deferred in read_rows(session, query)
    }


_ACTIVE_PER_RUN = (
    select(TaskInstance.dag_run_id, func.count(), Dag.max_active_tasks)
    .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
    .join(Dag, Dag.dag_id == DagRun.dag_id)
    .where(TaskInstance.state.in_(_ACTIVE))
    .group_by(TaskInstance.dag_run_id, Dag.max_active_tasks)
)


def active_per_run(session: Session) -> dict[int, tuple[int, int]]:
    """Run pk -> (its queued + running task instances, its DAG's max_active_tasks)."""
    rows = read_rows(session, _ACTIVE_PER_RUN)
    return {int(run): (int(n), int(cap)) for run, n, cap in rows}


def _task_pool() -> tuple[ColumnElement[str], ColumnElement[int]]:
    """A scheduled task instance's pool and slots: its task's (a task gone from its DAG file
    runs in ``default_pool``, one slot)."""
    return func.coalesce(DagTask.pool, DEFAULT_POOL), func.coalesce(DagTask.pool_slots, 1)


def _scheduled() -> Select[int, int, str, str, str, int, int, str]:
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
            Dag.fileloc,
        )
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .outerjoin(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.state == TaskState.SCHEDULED)
    )


@cache
def _candidates_query(
    *, full_pools: bool, full_runs: bool, postgres: bool
) -> Select[int, int, str, str, str, int, int, str]:
    """``candidates``' statement, built once per shape (``read_rows``)."""
    pool, slots = _task_pool()
    query = (
        _scheduled()
        .join(Pool, Pool.name == pool)
        .where((Pool.slots == UNLIMITED_SLOTS) | (slots <= Pool.slots))
        .order_by(TaskInstance.id)
        .limit(bindparam("window"))
    )
    if full_pools:
        query = query.where(pool.not_in(bindparam("full_pools", expanding=True)))
    if full_runs:
        query = query.where(TaskInstance.dag_run_id.not_in(bindparam("full_runs", expanding=True)))
    if postgres:
        query = query.with_for_update(skip_locked=True, of=TaskInstance)
    return query


def candidates(
    session: Session, *, window: int, full_pools: list[str], full_runs: list[int]
) -> list[Candidate]:
    """The first ``window`` scheduled task instances in id order whose pool exists, is not
    one of ``full_pools`` and is big enough for them, in runs not among ``full_runs``:
    those that cannot start now are left out here, so that they never crowd out of the
    window those that can. On PostgreSQL their rows are locked, ``SKIP LOCKED``."""
    query = _candidates_query(
        full_pools=bool(full_pools), full_runs=bool(full_runs), postgres=is_postgres(session)
    )
    params = {"window": window, "full_pools": full_pools, "full_runs": full_runs}
    return [Candidate(*row) for row in read_rows(session, query, params)]


def unstartable(session: Session, *, limit: int) -> list[tuple[Candidate, int | None]]:
    """Up to ``limit`` scheduled task instances whose pool does not exist (size None) or is
    smaller than their ``pool_slots``, with the size of their pool."""
    pool, slots = _task_pool()
    query = (
        _scheduled()
        .outerjoin(Pool, Pool.name == pool)
        .add_columns(Pool.slots)
        .where(Pool.name.is_(None) | ((Pool.slots != UNLIMITED_SLOTS) & (slots > Pool.slots)))
        .limit(limit)
    )
    return [(Candidate(*row), size) for *row, size in session.execute(query)]
