"""SQL of trigger rows: adding them (kwargs encrypted), fetching and counting them, who
serves which, releasing them, recording load errors and failures, rotating the Fernet key,
and deleting rows nothing references. Claiming is ``engine.db.queries.claims``.

Bulk paths use Core statements so a triggerer can handle thousands of rows per second.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Integer, any_, bindparam, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY

from engine.db.models import Asset, AssetWatcher, DagFile, DagTask, TaskInstance, Trigger, utcnow
from engine.db.queries.connections import rotate_secrets
from engine.states import TaskState, TriggerKind

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TriggerRow:
    """A claimed trigger row, still encrypted."""

    id: int
    classpath: str
    kwargs: str
    kind: str
    has_error: bool = False  # a failure is recorded on the row (e.g. it failed to load)
    stream_digest: str | None = None  # its shared-stream group (engine.db.queries.claims)


#: The columns of a ``TriggerRow``, in its field order.
TRIGGER_ROW_COLUMNS: Final = (
    Trigger.id,
    Trigger.classpath,
    Trigger.kwargs,
    Trigger.kind,
    # The column itself, not ``last_error IS NOT NULL``: SQLite (3.40) evaluates such an
    # expression wrongly in UPDATE ... RETURNING (every row came back "has an error").
    Trigger.last_error,
    Trigger.stream_digest,
)


def ids_in(session: Session, column: Any, ids: list[int]) -> Any:
    """``column IN ids``; on PostgreSQL ``column = ANY(array)``: one bound array rather than
    one placeholder per id, which for a claim of 1,000 rows took psycopg and the server
    longer to parse than to run (about half of a claim round's time)."""
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(bindparam(None, ids, type_=ARRAY(Integer)))
    return column.in_(ids)


def trigger_row(row: Any) -> TriggerRow:
    """A ``TriggerRow`` from a result of ``TRIGGER_ROW_COLUMNS``."""
    trigger_id, classpath, kwargs, kind, last_error, digest = row
    return TriggerRow(int(trigger_id), classpath, kwargs, kind, last_error is not None, digest)


@dataclass(frozen=True, slots=True)
class DecryptFailure:
    trigger_id: int | None
    error: str


def add_trigger_row(
    session: Session,
    cipher: KwargsCipher,
    classpath: str,
    kwargs: dict[str, Any],
    *,
    kind: TriggerKind,
    stream_digest: str | None = None,
) -> int:
    token = cipher.encrypt_kwargs(kwargs, owner=classpath)
    result = session.execute(
        insert(Trigger)
        .values(
            classpath=classpath,
            kwargs=token,
            kind=kind,
            created_date=utcnow(),
            stream_digest=stream_digest,
        )
        .returning(Trigger.id)
    )
    return int(result.scalar_one())


def fetch_trigger_rows(session: Session, ids: Iterable[int]) -> list[TriggerRow]:
    wanted = list(ids)
    if not wanted:
        return []
    rows = session.execute(select(*TRIGGER_ROW_COLUMNS).where(ids_in(session, Trigger.id, wanted)))
    return [trigger_row(row) for row in rows]


def owned_checksum(session: Session, *, triggerer_id: int) -> tuple[int, int]:
    """(count, sum of ids) of the rows assigned to ``triggerer_id``: a cheap change detector."""
    count, total = session.execute(
        select(func.count(Trigger.id), func.coalesce(func.sum(Trigger.id), 0)).where(
            Trigger.triggerer_id == triggerer_id
        )
    ).one()
    return int(count), int(total)


def owned_trigger_ids(session: Session, *, triggerer_id: int) -> set[int]:
    rows = session.execute(select(Trigger.id).where(Trigger.triggerer_id == triggerer_id))
    return set(rows.scalars())


@dataclass(frozen=True, slots=True)
class Served:
    """What a trigger serves: log fields, and for a watcher its (asset id, watcher name)."""

    log_fields: dict[str, object]
    watcher: tuple[int, str] | None = None


def triggers_served(session: Session, ids: Iterable[int]) -> dict[int, Served]:
    """For each trigger: ``dag_id``/``run_id``/``task_id`` of its deferred task (several
    tasks: the first), or ``asset``/``watcher`` of its watcher with the watcher's identity,
    which its fired events keep even if the watcher moves to a new trigger meanwhile."""
    from engine.db.models import DagRun, TaskInstance

    wanted = sorted(ids)
    served: dict[int, Served] = {}
    if not wanted:
        return served
    tasks = session.execute(
        select(TaskInstance.trigger_id, DagRun.dag_id, DagRun.run_id, TaskInstance.task_id)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(ids_in(session, TaskInstance.trigger_id, wanted))
        .order_by(TaskInstance.id)
    )
    for trigger_id, dag_id, run_id, task_id in tasks:
        if trigger_id is not None and trigger_id not in served:  # IN excludes NULL anyway
            # Interned: kept for the trigger's life, and repeated across a run's triggers.
            fields: dict[str, object] = {
                "dag_id": sys.intern(dag_id),
                "run_id": sys.intern(run_id),
                "task_id": sys.intern(task_id),
            }
            served[int(trigger_id)] = Served(fields)
    watchers = session.execute(
        select(AssetWatcher.trigger_id, AssetWatcher.asset_id, Asset.name, AssetWatcher.name)
        .join(Asset, Asset.id == AssetWatcher.asset_id)
        .where(ids_in(session, AssetWatcher.trigger_id, wanted))
    )
    for trigger_id, asset_id, asset, watcher in watchers:
        fields = {"asset": asset, "watcher": watcher}
        served.setdefault(int(trigger_id), Served(fields, (int(asset_id), str(watcher))))
    return served


def release_triggers(session: Session, *, triggerer_id: int) -> int:
    """Unassign every row of ``triggerer_id`` so another triggerer takes them at once."""
    result = session.execute(
        update(Trigger)
        .where(Trigger.triggerer_id == triggerer_id)
        .values(triggerer_id=None, claimed_at=None)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def rotate_trigger_kwargs(
    session: Session, cipher: KwargsCipher
) -> tuple[int, list[DecryptFailure]]:
    """Re-encrypt every encrypted value with the first key; values that fail are reported.

    Covers trigger kwargs, the stored last good parse (and source) of each DAG file, the start
    arguments of ``start_from_trigger`` tasks, and connections' and variables' secrets.
    ``DecryptFailure.trigger_id`` is None for a value that is not a trigger row (its error
    names what it is).
    """

    failures: list[DecryptFailure] = []
    counts = [
        _rotate(row, "kwargs", cipher, failures, trigger_id=row.id)
        for row in session.execute(select(Trigger)).scalars()
    ]
    for dag_file in session.execute(select(DagFile)).scalars():
        what = f"parse result of {dag_file.fileloc}"
        counts.append(_rotate(dag_file, "result", cipher, failures, what=what))
        if dag_file.source is not None:
            what = f"last good source of {dag_file.fileloc}"
            counts.append(_rotate(dag_file, "source", cipher, failures, what=what))
    tasks = select(DagTask).where(DagTask.start_trigger.is_not(None))
    for task in session.execute(tasks).scalars():
        what = f"start trigger of task {task.dag_id}.{task.task_id}"
        counts.append(_rotate(task, "start_trigger", cipher, failures, what=what))
    errors: list[str] = []  # connections and variables
    counts.append(rotate_secrets(session, cipher, errors))
    failures += [DecryptFailure(None, error) for error in errors]
    return sum(counts), failures


def _rotate(
    row: Any,
    attribute: str,
    cipher: KwargsCipher,
    failures: list[DecryptFailure],
    *,
    trigger_id: int | None = None,
    what: str = "",
) -> int:
    from engine.exceptions import DecryptionError

    try:
        setattr(row, attribute, cipher.rotate(getattr(row, attribute), trigger_id=trigger_id))
    except DecryptionError as exc:
        failures.append(DecryptFailure(trigger_id, f"{what}: {exc}" if what else str(exc)))
        return 0
    return 1


#: How the triggerer's reason for a trigger it cannot load (import, kwargs, decrypt) starts.
LOAD_FAILURE_PREFIX: Final = "cannot load trigger"


def clear_load_errors(session: Session, trigger_ids: Iterable[int]) -> None:
    """Forget the load failure of triggers that now load and run (e.g. the Fernet key was
    fixed): ``sluice triggers list`` and ``sluice doctor`` must not keep reporting it."""
    wanted = sorted(trigger_ids)
    if wanted:
        session.execute(
            update(Trigger)
            .where(Trigger.id.in_(wanted), Trigger.last_error.startswith(LOAD_FAILURE_PREFIX))
            .values(last_error=None)
        )


def record_trigger_failure(
    session: Session,
    trigger_id: int,
    error: str,
    *,
    unreachable_broker: str | None = None,
    unreachable_address: str | None = None,
) -> None:
    """Count a failure of the trigger. ``unreachable_broker`` / ``_address``: the upstream
    it could not reach, and where (None for a failure of another kind: they are cleared)."""
    session.execute(
        update(Trigger)
        .where(Trigger.id == trigger_id)
        .values(
            failure_count=Trigger.failure_count + 1,
            last_error=error[:10_000],
            last_failure_date=utcnow(),
            unreachable_broker=unreachable_broker and unreachable_broker[:100],
            unreachable_address=unreachable_address and unreachable_address[:1000],
        )
    )


def delete_unreferenced_triggers(session: Session) -> int:
    """Delete trigger rows no deferred task and no asset watcher references."""
    deferred = select(TaskInstance.trigger_id).where(
        TaskInstance.trigger_id.is_not(None), TaskInstance.state == TaskState.DEFERRED
    )
    watched = select(AssetWatcher.trigger_id)
    result = session.execute(
        delete(Trigger).where(Trigger.id.not_in(deferred), Trigger.id.not_in(watched))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def delete_unused_triggers(session: Session, trigger_ids: set[int]) -> None:
    if not trigger_ids:
        return
    deferred = select(TaskInstance.trigger_id).where(
        TaskInstance.trigger_id.is_not(None), TaskInstance.state == TaskState.DEFERRED
    )
    watched = select(AssetWatcher.trigger_id)
    session.execute(
        delete(Trigger).where(
            Trigger.id.in_(trigger_ids), Trigger.id.not_in(deferred), Trigger.id.not_in(watched)
        )
    )


def delete_trigger(session: Session, trigger_id: int) -> None:
    session.execute(delete(Trigger).where(Trigger.id == trigger_id))


def delete_triggers(session: Session, trigger_ids: Iterable[int]) -> None:
    wanted = list(trigger_ids)
    if wanted:
        session.execute(delete(Trigger).where(Trigger.id.in_(wanted)))
