"""Runs and what runs in them: backfills, DAG runs and the asset events that triggered them,
task instances, the pools they take slots in, and the callback requests executors run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from engine.db.models.base import Base, UtcDateTime, utcnow
from engine.states import DagRunState, TaskState


class Backfill(Base):
    """``sluice dags backfill``: the runs of a date range (or of partition keys), at most
    ``max_active_runs`` at once."""

    __tablename__ = "backfill"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dag_id: Mapped[str] = mapped_column(ForeignKey("dag.dag_id", ondelete="CASCADE"))
    # The date range of a backfill of logical dates; None for a partition backfill, which
    # runs its ``partition_keys`` instead.
    from_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    to_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    partition_keys: Mapped[list[str] | None] = mapped_column(JSON)
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
        Index(None, "dag_id", "partition_key"),
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
    # The time a run stands for (None for asset-triggered runs, as in
    # Airflow 3), its data interval, the earliest time it may start, and its backfill.
    logical_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    data_interval_start: Mapped[datetime | None] = mapped_column(UtcDateTime)
    data_interval_end: Mapped[datetime | None] = mapped_column(UtcDateTime)
    run_after: Mapped[datetime | None] = mapped_column(UtcDateTime)
    backfill_id: Mapped[int | None] = mapped_column(
        ForeignKey("backfill.id", ondelete="SET NULL"), index=True
    )
    #: the slice a partitioned run stands for (None for an unpartitioned run)
    partition_key: Mapped[str | None] = mapped_column(String(250))


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
    #: deferrals of the current try (reset when a fresh try starts)
    deferral_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: when an ``up_for_retry`` try may run again
    next_retry_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    #: -1 for an unmapped task (and a mapped one not expanded yet), 0..N-1 for the copies
    #: of a mapped task (engine.authoring.mapping)
    map_index: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    #: what the copy's ``map_index_template`` rendered to when it ran (Airflow's named
    #: mapping, shown instead of ``map_index``); None: shown by its number
    rendered_map_index: Mapped[str | None] = mapped_column(String(250))
    # The pool and slots the executor claimed it with (queued, running and, with the
    # pool's ``include_deferred``, deferred instances occupy them).
    pool: Mapped[str | None] = mapped_column(String(256))
    pool_slots: Mapped[int | None] = mapped_column(Integer)


class Pool(Base):
    """A named number of slots (Airflow's pools): the executors start a task only while its
    pool has ``pool_slots`` open (``engine.executor.admission``)."""

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


class Deadline(Base):
    """One deadline alert of one run (``engine.authoring.deadlines``): written by the
    scheduler when it first sees the run, ``deadline_time`` None when the alert's reference
    has no value for it (no logical date, too few runs for an average). Once past and the run
    not finished by then, the scheduler marks it ``missed`` and requests its callback in the
    same transaction: it fires once."""

    __tablename__ = "deadline"
    __table_args__ = (
        UniqueConstraint("dag_run_id", "alert_index"),
        Index(None, "missed", "deadline_time"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dag_run_id: Mapped[int] = mapped_column(ForeignKey("dag_run.id", ondelete="CASCADE"))
    #: the alert's position in the DAG's ``deadline`` list
    alert_index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str | None] = mapped_column(String(250))
    reference: Mapped[str] = mapped_column(String(100))
    deadline_time: Mapped[datetime | None] = mapped_column(UtcDateTime)
    #: the alert as the DAG declared it when the deadline was set (callback path, kwargs)
    alert: Mapped[Any] = mapped_column(JSON)
    missed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    missed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
