"""What an executor is configured with (``ExecutorSettings``, from ``[core]``,
``[scheduler]``, ``[executor]`` ...) and what it counts (``ExecutorStats``); shared by the
local executor, the Celery sender and worker and the callback runner.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from engine.config import Config


@dataclass
class ExecutorStats:
    claimed: int = 0
    #: of ``claimed``: in the transaction that recorded another step's end
    claimed_with_outcome: int = 0
    discarded: int = 0  # outcomes of task instances taken over meanwhile
    outcomes: Counter[str] = field(default_factory=Counter)  # Decision -> count


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    parallelism: int
    dags_folder: Path
    plugins_folder: Path | None
    task_log_folder: Path
    default_deferrable: bool = False
    heartbeat_s: float = 5.0
    health_check_threshold_s: float = 10.5
    #: the local executor's claim poll and the callback runner's: nudges and row signals
    #: wake them, so this bounds what a lost wake-up costs ([scheduler]
    #: idle_poll_interval_sec)
    poll_interval_s: float = 0.05
    #: the Celery sender's poll ([scheduler] loop_interval_sec): no row signal wakes it, and
    #: it also watches its queued tries' progress
    sender_poll_s: float = 0.05
    shutdown_grace_s: float = 30.0
    #: SIGTERM -> SIGKILL at shutdown, and how long past its execution deadline a task that
    #: ignores its timeout keeps running before it is killed
    kill_grace_s: float = 3.0
    #: configured secrets: kept out of the tasks' environment and replaced in their logs
    secrets: tuple[str, ...] = ()
    #: ``[scheduler] keep_events_while_paused``, for the events of tasks' outlets
    keep_events_while_paused: bool = True
    #: ``[scheduler] schedule_after_task_execution``: advance a task's run in the
    #: transaction that records its end (``engine.executor.recording``)
    schedule_after_task_execution: bool = True
    #: ``[core] max_xcom_size_bytes``: the largest result a task may store
    max_xcom_size_bytes: int | None = 1_048_576
    #: fork task steps from a pre-imported warm runner (``engine.executor.warm_runner``)
    #: rather than start a fresh interpreter for each; a cold start stays the fallback
    warm_runner: bool = True
    #: and import ahead the installed packages the DAG files import. Off by default: a
    #: package seeded at import (numpy's global random state, say) would give every forked
    #: step the same state, where fresh interpreters each get their own
    warm_runner_dag_imports: bool = False
    #: ``[state_store] default_retention_days``: how long a task state store entry written
    #: without a retention of its own is kept (0: never expires)
    state_store_retention_days: int = 30

    @classmethod
    def from_config(cls, config: Config) -> ExecutorSettings:
        return cls(
            parallelism=config.core.parallelism,
            dags_folder=config.core.dags_folder,
            plugins_folder=config.core.plugins_folder,
            task_log_folder=config.logging.task_log_folder,
            default_deferrable=config.operators.default_deferrable,
            heartbeat_s=config.scheduler.scheduler_heartbeat_sec,
            health_check_threshold_s=config.scheduler.health_check_threshold_s,
            poll_interval_s=config.scheduler.idle_poll_interval_sec,
            sender_poll_s=config.scheduler.loop_interval_sec,
            shutdown_grace_s=config.triggerer.shutdown_grace_period_sec,
            secrets=tuple(config.secret_values()),
            keep_events_while_paused=config.scheduler.keep_events_while_paused,
            schedule_after_task_execution=config.scheduler.schedule_after_task_execution,
            max_xcom_size_bytes=config.core.max_xcom_size_bytes,
            warm_runner=config.executor.warm_runner,
            warm_runner_dag_imports=config.executor.warm_runner_dag_imports,
            state_store_retention_days=config.state_store.default_retention_days,
        )
