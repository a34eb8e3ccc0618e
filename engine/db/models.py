"""SQLAlchemy models of the metadata database.

Timestamps are stored as naive UTC (SQLite has no time zones) and always read back as aware
UTC datetimes through ``UtcDateTime``. Trigger kwargs are stored only encrypted (see
``engine.crypto``); the ``kwargs`` column holds a Fernet token.
"""

from __future__ import annotations

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
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from engine.states import DagRunState, JobState, TaskState, TriggerKind

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


#: The pool of a task that names none (Airflow's); the migration creates it with 128 slots.
DEFAULT_POOL = "default_pool"
DEFAULT_POOL_SLOTS = 128


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
    # Migration 0020: the Celery queues a `sluice celery worker` consumes, comma-separated
    # (None for every other part).
    queues: Mapped[str | None] = mapped_column(String(2000))


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
    #: When its current triggerer claimed it (migration 0015; None while unclaimed).
    claimed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Dag(Base):
    __tablename__ = "dag"

    dag_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    fileloc: Mapped[str] = mapped_column(String(2000))
    is_paused: Mapped[bool] = mapped_column(Boolean, default=False)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    schedule: Mapped[Any | None] = mapped_column(JSON)  # the asset condition, if any
    description: Mapped[str | None] = mapped_column(Text)
    last_parsed_time: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Time schedules (migration 0009). ``timetable`` is the serialized timetable
    # (engine.authoring.timetables); the ``next_dagrun*`` columns are the scheduler's: the
    # next time run, computed from the last one when ``next_dagrun_computed`` is false (a new
    # DAG, a changed schedule, an unpause). NULL with ``next_dagrun_computed``: no next run.
    timetable: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    timetable_summary: Mapped[str | None] = mapped_column(String(1000))
    timezone: Mapped[str] = mapped_column(String(100), default="UTC", server_default="UTC")
    start_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    end_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    catchup: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    max_active_runs: Mapped[int] = mapped_column(Integer, default=16, server_default="16")
    max_active_tasks: Mapped[int] = mapped_column(Integer, default=16, server_default="16")
    dagrun_timeout_s: Mapped[float | None] = mapped_column(Float)
    tags: Mapped[Any | None] = mapped_column(JSON, default=list)
    params: Mapped[Any | None] = mapped_column(JSON)
    doc_md: Mapped[str | None] = mapped_column(Text)
    display_name: Mapped[str | None] = mapped_column(String(2000))
    next_dagrun_computed: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    next_dagrun: Mapped[datetime | None] = mapped_column(UtcDateTime)
    next_dagrun_data_interval_start: Mapped[datetime | None] = mapped_column(UtcDateTime)
    next_dagrun_data_interval_end: Mapped[datetime | None] = mapped_column(UtcDateTime)
    next_dagrun_create_after: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Migration 0012: whether the DAG has run callbacks (the scheduler requests them).
    has_on_success_callback: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    has_on_failure_callback: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )


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
    __table_args__ = (
        UniqueConstraint("asset_id", "dedup_key"),
        # Migration 0016: an asset's latest events without a scan of all of them (a task's
        # inlet_events, `assets events`, the last event of an asset), and a watcher's latest
        # event even when the watcher has been silent for long (`dags why`).
        Index(None, "asset_id", "id"),
        Index(None, "asset_id", "source_watcher", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    payload: Mapped[Any] = mapped_column(JSON)
    dedup_key: Mapped[str | None] = mapped_column(String(512))
    source_trigger_id: Mapped[int | None] = mapped_column(Integer)
    source_watcher: Mapped[str | None] = mapped_column(String(1500))
    timestamp: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    # Migration 0009: where the event came from ("watcher", "task", "cli", "api"), the
    # event's ``extra``, the task try that produced it (outlets), the alias it was attached
    # through, and who emitted it from outside ("cli:user@host").
    source: Mapped[str | None] = mapped_column(String(20))
    extra: Mapped[Any | None] = mapped_column(JSON)
    source_dag_id: Mapped[str | None] = mapped_column(String(250))
    source_run_id: Mapped[str | None] = mapped_column(String(250))
    source_task_id: Mapped[str | None] = mapped_column(String(250))
    source_try_number: Mapped[int | None] = mapped_column(Integer)
    source_alias: Mapped[str | None] = mapped_column(String(1500))
    created_by: Mapped[str | None] = mapped_column(String(500))


class AssetAlias(Base):
    """A name that tasks attach asset events to at run time (``outlet_events[alias].add``)."""

    __tablename__ = "asset_alias"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(1500), unique=True)


class AssetAliasAsset(Base):
    """The assets an alias has resolved to (a row per asset an event was attached to)."""

    __tablename__ = "asset_alias_asset"

    alias_id: Mapped[int] = mapped_column(
        ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True
    )
    asset_id: Mapped[int] = mapped_column(
        ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class DagScheduleAssetAlias(Base):
    """An alias the schedule of an *active* DAG references."""

    __tablename__ = "dag_schedule_asset_alias"

    dag_id: Mapped[str] = mapped_column(
        ForeignKey("dag.dag_id", ondelete="CASCADE"), primary_key=True
    )
    alias_id: Mapped[int] = mapped_column(
        ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class Backfill(Base):
    """``sluice dags backfill``: the runs of a date range, at most ``max_active_runs`` at once."""

    __tablename__ = "backfill"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dag_id: Mapped[str] = mapped_column(ForeignKey("dag.dag_id", ondelete="CASCADE"))
    from_date: Mapped[datetime] = mapped_column(UtcDateTime)
    to_date: Mapped[datetime] = mapped_column(UtcDateTime)
    reprocess: Mapped[str] = mapped_column(String(20))
    max_active_runs: Mapped[int] = mapped_column(Integer)
    created_by: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class DagRun(Base):
    __tablename__ = "dag_run"
    __table_args__ = (
        UniqueConstraint("dag_id", "run_id"),
        # Two schedulers on one database never create one interval twice (NULL for runs
        # without a logical date, e.g. asset-triggered: never matched).
        UniqueConstraint("dag_id", "logical_date"),
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
    # Migration 0009: the time a run stands for (None for asset-triggered runs, as in
    # Airflow 3), its data interval, the earliest time it may start, and its backfill.
    logical_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    data_interval_start: Mapped[datetime | None] = mapped_column(UtcDateTime)
    data_interval_end: Mapped[datetime | None] = mapped_column(UtcDateTime)
    run_after: Mapped[datetime | None] = mapped_column(UtcDateTime)
    backfill_id: Mapped[int | None] = mapped_column(
        ForeignKey("backfill.id", ondelete="SET NULL"), index=True
    )


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
        UniqueConstraint("dag_run_id", "task_id", "map_index"),
        Index(None, "state", "trigger_timeout"),
        Index(None, "pool", "state"),
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
    # Migration 0010: when an ``up_for_retry`` try may run again.
    next_retry_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Migration 0013: -1 for an unmapped task (and a mapped one not expanded yet), 0..N-1
    # for the copies of a mapped task (engine.authoring.mapping).
    map_index: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    # Migration 0012: the pool and slots the executor claimed it with (queued, running and,
    # with the pool's ``include_deferred``, deferred instances occupy them).
    pool: Mapped[str | None] = mapped_column(String(256))
    pool_slots: Mapped[int | None] = mapped_column(Integer)


# --- DAG processing (engine.dag_processing) --------------------------------------------
# Added by the DAG processor work: parse results, parse errors, DAG tasks, schedule edges.


class DagFile(Base):
    """The last good parse of one DAG file, Fernet-encrypted (watcher kwargs hold secrets).

    A file that stops importing keeps this row, so its DAGs and watchers keep their last
    good version, and its tasks run ``source``, the text that parsed (encrypted too: a DAG
    file may hold secrets; None for a row written before it was kept); the row goes when
    the file is deleted.
    """

    __tablename__ = "dag_file"

    fileloc: Mapped[str] = mapped_column(String(2000), primary_key=True)
    result: Mapped[str] = mapped_column(Text)
    parsed_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    source: Mapped[str | None] = mapped_column(Text, deferred=True)


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
    # Migration 0009: asset names the task updates on success, the aliases it may attach
    # events to, and the asset and alias names it reads (``inlet_events``).
    outlets: Mapped[Any | None] = mapped_column(JSON, default=list)
    outlet_aliases: Mapped[Any | None] = mapped_column(JSON, default=list)
    inlets: Mapped[Any | None] = mapped_column(JSON, default=list)
    inlet_aliases: Mapped[Any | None] = mapped_column(JSON, default=list)
    # Migration 0010: the task's trigger rule and how long a failed try waits to retry.
    trigger_rule: Mapped[str] = mapped_column(
        String(50), default="all_success", server_default="all_success"
    )
    retry_delay_s: Mapped[float] = mapped_column(Float, default=300.0, server_default="300")
    retry_exponential_backoff: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    max_retry_delay_s: Mapped[float | None] = mapped_column(Float)
    # Migration 0013: what a mapped task maps over (``MappedOperator.mapping_json()``);
    # None for an unmapped task.
    mapping: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    # Migration 0012: the pool the task runs in and the slots it takes there.
    pool: Mapped[str] = mapped_column(
        String(256), default=DEFAULT_POOL, server_default=DEFAULT_POOL
    )
    pool_slots: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Migration 0020: the Celery queue its tries are sent to (None: [celery] default_queue).
    queue: Mapped[str | None] = mapped_column(String(256))


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
    #: Migration 0016: the key's digest, as ``trigger.stream_digest`` holds it (None: the
    #: key has no stable digest). Ties a watcher's trigger row to its group's snapshot.
    stream_digest: Mapped[str | None] = mapped_column(String(64))


class SharedStreamSample(Base):
    """A short history of each shared-stream group (migration 0015): what its triggerer
    published at each heartbeat, the last ``SAMPLES_KEPT`` per group (triggerer and key: two
    triggerers may each run a group of one key), for the advance rate and the UI's sparkline
    (``engine.db.views.ops``). Counters are totals since the group started on that
    triggerer, so a rate is taken between samples of one triggerer only."""

    __tablename__ = "shared_stream_sample"
    __table_args__ = (Index(None, "triggerer_id", "stream_key", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    triggerer_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    stream_key: Mapped[str] = mapped_column(String(1000))
    sampled_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    outstanding: Mapped[int] = mapped_column(Integer, default=0)
    oldest_unresolved_age_s: Mapped[float | None] = mapped_column(Float)
    events_polled: Mapped[int] = mapped_column(BigInteger, default=0)
    advances: Mapped[int] = mapped_column(BigInteger, default=0)
    advanced_events: Mapped[int] = mapped_column(BigInteger, default=0)


# --- connections and variables (engine.authoring.connections) ---------------------------


class StoredConnection(Base):
    """A named connection; ``password`` and ``extra`` (JSON text) are Fernet tokens."""

    __tablename__ = "connection"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conn_id: Mapped[str] = mapped_column(String(250), unique=True)
    conn_type: Mapped[str] = mapped_column(String(500))
    description: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(500))
    schema: Mapped[str | None] = mapped_column(String(500))
    login: Mapped[str | None] = mapped_column(Text)
    password: Mapped[str | None] = mapped_column(Text)
    port: Mapped[int | None] = mapped_column(Integer)
    extra: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class StoredVariable(Base):
    """A named variable; ``val`` is a Fernet token of its text."""

    __tablename__ = "variable"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(250), unique=True)
    val: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


# --- Pools and callbacks (migration 0012) ------------------------------------------------


class Pool(Base):
    """A named number of slots (Airflow's pools): the executors start a task only while its
    pool has ``pool_slots`` open (``engine.db.queries.pools``)."""

    __tablename__ = "pool"

    name: Mapped[str] = mapped_column(String(256), primary_key=True)
    slots: Mapped[int] = mapped_column(Integer)
    description: Mapped[str | None] = mapped_column(Text)
    #: deferred task instances occupy their slots too (queued and running ones always do)
    include_deferred: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class CallbackRequest(Base):
    """A callback to run in a child process (``engine.executor.callbacks``): a DAG's
    ``on_success_callback`` / ``on_failure_callback`` when its run ends, or a task's when its
    own process could not run it (killed, crashed). Claimed by one live executor
    (``executor_job_id``) and deleted once run: at least once."""

    __tablename__ = "callback_request"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(20))  # "dag" or "task"
    dag_id: Mapped[str] = mapped_column(String(250))
    run_id: Mapped[str] = mapped_column(String(250))
    data: Mapped[Any] = mapped_column(JSON)
    executor_job_id: Mapped[int | None] = mapped_column(Integer, index=True)


# --- users, API tokens and UI sessions (migration 0014, engine.api) ---------------------


class User(Base):
    """Who may use the API and UI; ``role`` is admin, op or viewer. ``password_hash`` is an
    Argon2id hash (``engine.api.credentials``) and never leaves the API process."""

    __tablename__ = "users"  # "user" is a reserved word in PostgreSQL

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(250), unique=True)
    role: Mapped[str] = mapped_column(String(20))
    password_hash: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ApiToken(Base):
    """A bearer token of a user: only its SHA-256 is stored, and a short prefix to tell
    tokens apart in listings. Revoked tokens are kept (``revoked_at``) so a listing says so."""

    __tablename__ = "api_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(250))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class UiSession(Base):
    """A UI login: the SHA-256 of the session cookie's value, the CSRF token of its forms and
    its expiry. In the database, so any API process behind a load balancer serves it and a
    logout ends it everywhere."""

    __tablename__ = "ui_session"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
