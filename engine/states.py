"""The states the engine stores and every part reads: task instances, DAG runs, jobs, triggers.

A leaf: it imports nothing of the engine and no ORM, so the task process (which never
touches the database), the triggers it defers to and the models all use these one
definitions. The values are what the metadata database holds (and Airflow's names): never
change one, only add.
"""

from __future__ import annotations

import enum

__all__ = ("DagRunState", "JobState", "TaskState", "TriggerKind")


class TaskState(enum.StrEnum):
    """A task instance's state (Airflow's ``TaskInstanceState`` values, plus ``none``)."""

    NONE = "none"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    DEFERRED = "deferred"
    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"
    UPSTREAM_FAILED = "upstream_failed"
    UP_FOR_RETRY = "up_for_retry"  # failed, waits for next_retry_at without a worker slot
    #: cleared while running: its executor stops the process, then it is ``none`` again
    RESTARTING = "restarting"


class DagRunState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class JobState(enum.StrEnum):
    """The state of a running engine part's ``job`` row (triggerer, scheduler, executor ...)."""

    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class TriggerKind(enum.StrEnum):
    """What a trigger row serves: a deferred task, or an asset's watcher."""

    TASK = "task"
    WATCHER = "watcher"
