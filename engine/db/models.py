"""SQLAlchemy models of the metadata database.

Timestamps are stored as naive UTC (SQLite has no time zones) and always read back as aware
UTC datetimes through ``UtcDateTime``. Trigger kwargs are stored only encrypted (see
``engine.crypto``); the ``kwargs`` column holds a Fernet token.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A datetime column stored as naive UTC and returned as an aware UTC datetime."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to a UTC column; use an aware one")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobState(enum.StrEnum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class TriggerKind(enum.StrEnum):
    TASK = "task"
    WATCHER = "watcher"


class TaskState(enum.StrEnum):
    NONE = "none"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    DEFERRED = "deferred"
    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"
    UPSTREAM_FAILED = "upstream_failed"


class DagRunState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class Job(Base):
    """A running engine part (triggerer, scheduler, ...) and its heartbeat."""

    __tablename__ = "job"
    __table_args__ = (Index(None, "job_type", "state", "latest_heartbeat"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_type: Mapped[str] = mapped_column(String(30))
    state: Mapped[str] = mapped_column(String(20), default=JobState.RUNNING)
    hostname: Mapped[str] = mapped_column(String(500), default="")
    pid: Mapped[int | None] = mapped_column(Integer)
    capacity: Mapped[int | None] = mapped_column(Integer)
    start_date: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    end_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    latest_heartbeat: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class Trigger(Base):
    """A trigger to run: class path and Fernet-encrypted kwargs; owned by one triggerer."""

    __tablename__ = "trigger"
    # (digest, owner): who holds a group; (owner, digest): the groups one triggerer holds and
    # its unassigned single rows (owner NULL, digest NULL) without a scan of all rows.
    __table_args__ = (
        Index(None, "stream_digest", "triggerer_id"),
        Index(None, "triggerer_id", "stream_digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    classpath: Mapped[str] = mapped_column(String(1000))
    kwargs: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20), default=TriggerKind.TASK)
    created_date: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    triggerer_id: Mapped[int | None] = mapped_column(
        ForeignKey("job.id", ondelete="SET NULL"), index=True
    )
    failure_count: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_failure_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    #: Digest of the trigger's ``shared_stream_key()`` (None: it shares no stream, or the row
    #: was written before the digest existed and no triggerer has loaded it yet). Rows with
    #: one digest are claimed, held and moved as one group: one owner per key, fleet-wide.
    stream_digest: Mapped[str | None] = mapped_column(String(64))


class Dag(Base):
    __tablename__ = "dag"

    dag_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    fileloc: Mapped[str] = mapped_column(String(2000))
    is_paused: Mapped[bool] = mapped_column(Boolean, default=False)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    schedule: Mapped[Any | None] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text)
    last_parsed_time: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Asset(Base):
    __tablename__ = "asset"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(1500), unique=True)
    uri: Mapped[str] = mapped_column(String(1500))
    extra: Mapped[Any] = mapped_column(JSON, default=dict)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class AssetWatcher(Base):
    __tablename__ = "asset_watcher"
    __table_args__ = (UniqueConstraint("asset_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(1500))
    trigger_id: Mapped[int] = mapped_column(
        ForeignKey("trigger.id", ondelete="CASCADE"), index=True
    )


class AssetEvent(Base):
    """One update of an asset; ``dedup_key`` makes a redelivered message a no-op.

    The key names the delivery (broker coordinates, a message id, a file's identity). An
    event without one (NULL: the unique constraint never matches NULLs) is never merged.
    """

    __tablename__ = "asset_event"
    __table_args__ = (UniqueConstraint("asset_id", "dedup_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    payload: Mapped[Any] = mapped_column(JSON)
    dedup_key: Mapped[str | None] = mapped_column(String(512))
    source_trigger_id: Mapped[int | None] = mapped_column(Integer)
    source_watcher: Mapped[str | None] = mapped_column(String(1500))
    timestamp: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class DagRun(Base):
    __tablename__ = "dag_run"
    __table_args__ = (
        UniqueConstraint("dag_id", "run_id"),
        Index(None, "dag_id", "state"),
        Index(None, "state", "queued_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dag_id: Mapped[str] = mapped_column(ForeignKey("dag.dag_id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(String(250))
    run_type: Mapped[str] = mapped_column(String(50))
    state: Mapped[str] = mapped_column(String(50), default=DagRunState.QUEUED)
    conf: Mapped[Any | None] = mapped_column(JSON)
    queued_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    start_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    end_date: Mapped[datetime | None] = mapped_column(UtcDateTime)


class DagRunAssetEvent(Base):
    """The asset events that triggered a DAG run (all of them, none silently dropped)."""

    __tablename__ = "dag_run_asset_event"

    dag_run_id: Mapped[int] = mapped_column(
        ForeignKey("dag_run.id", ondelete="CASCADE"), primary_key=True
    )
    asset_event_id: Mapped[int] = mapped_column(
        ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class TaskInstance(Base):
    __tablename__ = "task_instance"
    __table_args__ = (
        UniqueConstraint("dag_run_id", "task_id"),
        Index(None, "state", "trigger_timeout"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dag_run_id: Mapped[int] = mapped_column(ForeignKey("dag_run.id", ondelete="CASCADE"))
    dag_id: Mapped[str] = mapped_column(String(250))
    task_id: Mapped[str] = mapped_column(String(250))
    state: Mapped[str] = mapped_column(String(20), default=TaskState.NONE)
    try_number: Mapped[int] = mapped_column(Integer, default=0)
    max_tries: Mapped[int] = mapped_column(Integer, default=0)
    trigger_id: Mapped[int | None] = mapped_column(
        ForeignKey("trigger.id", ondelete="SET NULL"), index=True
    )
    next_method: Mapped[str | None] = mapped_column(String(1000))
    next_kwargs: Mapped[str | None] = mapped_column(Text)
    trigger_timeout: Mapped[datetime | None] = mapped_column(UtcDateTime)
    queued_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    start_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    end_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    hostname: Mapped[str | None] = mapped_column(String(500))
    pid: Mapped[int | None] = mapped_column(Integer)
    #: seconds spent running so far, across deferrals (``execution_timeout`` counts this)
    runtime_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    #: the executor job running it (its death makes the task eligible for recovery)
    executor_job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    #: values the task published as it ended (return value, end_from_trigger xcoms)
    xcoms: Mapped[Any | None] = mapped_column(JSON)
    # Added by the executor work (engine.executor):
    #: deferrals of the current try (reset when a fresh try starts)
    deferral_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


# --- DAG processing (engine.dag_processing) --------------------------------------------
# Added by the DAG processor work: parse results, parse errors, DAG tasks, schedule edges.


class DagFile(Base):
    """The last good parse of one DAG file, Fernet-encrypted (watcher kwargs hold secrets).

    A file that stops importing keeps this row, so its DAGs and watchers keep their last
    good version; the row goes when the file is deleted.
    """

    __tablename__ = "dag_file"

    fileloc: Mapped[str] = mapped_column(String(2000), primary_key=True)
    result: Mapped[str] = mapped_column(Text)
    parsed_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class DagParseError(Base):
    """Why a DAG file could not be used (import error, timeout, conflict), with its line."""

    __tablename__ = "dag_parse_error"

    fileloc: Mapped[str] = mapped_column(String(2000), primary_key=True)
    error: Mapped[str] = mapped_column(Text)
    lineno: Mapped[int | None] = mapped_column(Integer)
    stacktrace: Mapped[str | None] = mapped_column(Text)
    timestamp: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class DagScheduleAsset(Base):
    """An asset the schedule of an *active* DAG references (rows go when the DAG retires)."""

    __tablename__ = "dag_schedule_asset"

    dag_id: Mapped[str] = mapped_column(
        ForeignKey("dag.dag_id", ondelete="CASCADE"), primary_key=True
    )
    asset_id: Mapped[int] = mapped_column(
        ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class DagTask(Base):
    """A task of a DAG as last parsed: what the scheduler needs without importing the file."""

    __tablename__ = "dag_task"

    dag_id: Mapped[str] = mapped_column(
        ForeignKey("dag.dag_id", ondelete="CASCADE"), primary_key=True
    )
    task_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    operator: Mapped[str] = mapped_column(String(1000))
    downstream_task_ids: Mapped[Any] = mapped_column(JSON, default=list)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    start_from_trigger: Mapped[bool] = mapped_column(Boolean, default=False)
    execution_timeout_s: Mapped[int | None] = mapped_column(Integer)  # rounded up
    position: Mapped[int] = mapped_column(Integer, default=0)
    # Added by the executor work: for a ``start_from_trigger`` task, its ``start_trigger_args``
    # as Fernet-encrypted tagged JSON ({classpath, kwargs, next_method, next_kwargs,
    # timeout_s}), so the scheduler defers it without importing the DAG file.
    start_trigger: Mapped[str | None] = mapped_column(Text)


class AssetEventQueue(Base):
    """Asset events a DAG has not consumed yet.

    Written in the same transaction as the asset event (one row per DAG scheduled on the
    asset), deleted in the transaction that creates the DAG run consuming it: no event is
    dropped, none is consumed twice, whatever the commit order of concurrent writers.
    """

    __tablename__ = "asset_event_queue"

    dag_id: Mapped[str] = mapped_column(
        ForeignKey("dag.dag_id", ondelete="CASCADE"), primary_key=True
    )
    asset_event_id: Mapped[int] = mapped_column(
        ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


# --- Inspection (engine.db.queries.inspection) ----------------------------------------
# Added by the inspection work: what each triggerer's shared-stream groups report.


class SharedStreamSnapshot(Base):
    """The last published ``GroupStats`` of one shared-stream group of one triggerer.

    The triggerer rewrites its rows every heartbeat and deletes them when it stops, so
    ``sluice streams list`` can read every live triggerer's groups from the database.
    """

    __tablename__ = "shared_stream_snapshot"

    triggerer_id: Mapped[int] = mapped_column(
        ForeignKey("job.id", ondelete="CASCADE"), primary_key=True
    )
    stream_key: Mapped[str] = mapped_column(String(1000), primary_key=True)
    mode: Mapped[str] = mapped_column(String(10))
    subscribers: Mapped[int] = mapped_column(Integer, default=0)
    queue_high_water: Mapped[int] = mapped_column(Integer, default=0)
    outstanding_by_lane: Mapped[Any] = mapped_column(JSON, default=dict)
    oldest_unresolved_age_s: Mapped[float | None] = mapped_column(Float)
    events_polled: Mapped[int] = mapped_column(BigInteger, default=0)
    deliveries: Mapped[int] = mapped_column(BigInteger, default=0)
    advances: Mapped[int] = mapped_column(BigInteger, default=0)
    advanced_events: Mapped[int] = mapped_column(BigInteger, default=0)
    last_advance_batch: Mapped[int] = mapped_column(Integer, default=0)
    advance_latency_sum_s: Mapped[float] = mapped_column(Float, default=0.0)
    overflows: Mapped[int] = mapped_column(Integer, default=0)
    ack_timeouts: Mapped[int] = mapped_column(Integer, default=0)
    rejects: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
