"""What the scheduler is configured with (``SchedulerSettings``, from ``[scheduler]``) and
what it counts (``SchedulerStats``, for the metrics and for how long its loop waits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import Config

__all__ = ("SchedulerSettings", "SchedulerStats")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    #: the poll while runs are running (their retries, timeouts and deadlines come due)
    loop_interval_s: float = 0.05
    #: the poll while no run is running and the last loop changed nothing: every change
    #: that makes work wakes the loop (in-process nudges, ``RowsSignal``), so this only
    #: bounds what a lost wake-up costs
    idle_poll_s: float = 1.0
    heartbeat_s: float = 5.0
    health_check_threshold_s: float = 10.5
    executor_health_check_threshold_s: float = 10.5
    #: ``[scheduler] task_instance_heartbeat_timeout``: when a running try of a silent
    #: executor is failed (a queued one is requeued after the health threshold)
    task_heartbeat_timeout_s: float = 300.0

    @classmethod
    def from_config(cls, config: Config) -> SchedulerSettings:
        s = config.scheduler
        return cls(
            loop_interval_s=s.loop_interval_sec,
            idle_poll_s=s.idle_poll_interval_sec,
            heartbeat_s=s.scheduler_heartbeat_sec,
            health_check_threshold_s=s.health_check_threshold_s,
            executor_health_check_threshold_s=s.health_check_threshold_s,
            task_heartbeat_timeout_s=s.task_instance_heartbeat_timeout,
        )


@dataclass
class SchedulerStats:
    loops: int = 0
    runs_created: int = 0  # asset-triggered
    time_runs_created: int = 0
    tasks_scheduled: int = 0
    runs_finished: int = 0
    running_runs: int = 0  # running runs the last loop advanced

    def progress(self) -> tuple[int, int, int, int]:
        """What a loop that made progress changes (compared before and after it)."""
        return (self.runs_created, self.time_runs_created, self.tasks_scheduled, self.runs_finished)
