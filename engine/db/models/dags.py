"""DAGs as the DAG processor stores them (``engine.dag_processing``): DAG files (the last
good parse) and their parse errors, DAGs, their tasks, and the assets and aliases their
schedules reference.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from engine.authoring.callbacks import DEFAULT_POOL
from engine.db.models.base import Base, UtcDateTime, utcnow


class Dag(Base):
    __tablename__ = "dag"

    dag_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    fileloc: Mapped[str] = mapped_column(String(2000))
    is_paused: Mapped[bool] = mapped_column(Boolean, default=False)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    schedule: Mapped[Any | None] = mapped_column(JSON)  # the asset condition, if any
    description: Mapped[str | None] = mapped_column(Text)
    last_parsed_time: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Time schedules. ``timetable`` is the serialized timetable
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
    #: whether the DAG has run callbacks (the scheduler requests them)
    has_on_success_callback: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    has_on_failure_callback: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    #: the DAG's deadline alerts (``engine.authoring.deadlines``), None without any
    deadline_alerts: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))


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
    #: for a ``start_from_trigger`` task, its ``start_trigger_args`` as Fernet-encrypted
    #: tagged JSON ({classpath, kwargs, next_method, next_kwargs, timeout_s}), so the
    #: scheduler defers it without importing the DAG file
    start_trigger: Mapped[str | None] = mapped_column(Text)
    # The asset names the task updates on success, the aliases it may attach
    # events to, and the asset and alias names it reads (``inlet_events``).
    outlets: Mapped[Any | None] = mapped_column(JSON, default=list)
    outlet_aliases: Mapped[Any | None] = mapped_column(JSON, default=list)
    inlets: Mapped[Any | None] = mapped_column(JSON, default=list)
    inlet_aliases: Mapped[Any | None] = mapped_column(JSON, default=list)
    # The task's trigger rule and how long a failed try waits to retry.
    trigger_rule: Mapped[str] = mapped_column(
        String(50), default="all_success", server_default="all_success"
    )
    retry_delay_s: Mapped[float] = mapped_column(Float, default=300.0, server_default="300")
    retry_exponential_backoff: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    max_retry_delay_s: Mapped[float | None] = mapped_column(Float)
    #: what a mapped task maps over (``MappedOperator.mapping_json()``); None for an
    #: unmapped task
    mapping: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    # The pool the task runs in and the slots it takes there.
    pool: Mapped[str] = mapped_column(
        String(256), default=DEFAULT_POOL, server_default=DEFAULT_POOL
    )
    pool_slots: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: the Celery queue its tries are sent to (None: [celery] default_queue)
    queue: Mapped[str | None] = mapped_column(String(256))


class DagScheduleAsset(Base):
    """An asset the schedule of an *active* DAG references (rows go when the DAG retires)."""

    __tablename__ = "dag_schedule_asset"

    dag_id: Mapped[str] = mapped_column(
        ForeignKey("dag.dag_id", ondelete="CASCADE"), primary_key=True
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
