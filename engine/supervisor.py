"""One process, one root task group: the engine parts under a supervisor.

SIGTERM/SIGINT starts a graceful stop (each part drains within its grace period); a second
signal cancels everything at once. A part that crashes is reported and the process exits
non-zero rather than limping on.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Any, Final

import anyio

from engine.crypto import KwargsCipher
from engine.db import Database, check_schema
from engine.triggerer import Triggerer, TriggererSettings

if TYPE_CHECKING:
    from engine.config import Config

logger = logging.getLogger(__name__)

#: Parts ``sluice run`` starts. The DAG processor, scheduler and executor arrive with their
#: own issue; until then ``sluice run`` says plainly that only these run.
ALL_PARTS: Final[tuple[str, ...]] = ("triggerer",)
NOT_YET_AVAILABLE: Final[tuple[str, ...]] = ("dag-processor", "scheduler", "executor")


def triggerer_settings(config: Config, overrides: dict[str, Any]) -> TriggererSettings:
    t = config.triggerer
    return TriggererSettings(
        capacity=int(overrides.get("capacity") or t.capacity),
        heartbeat_s=t.job_heartbeat_sec,
        health_check_threshold_s=t.health_check_threshold_s,
        allowed_modules=tuple(t.allowed_trigger_modules),
        plugins_folder=config.core.plugins_folder,
        blocked_threshold_s=t.blocked_main_thread_warning_threshold,
        cleanup_interval_s=t.cleanup_interval_sec,
        cleanup_timeout_s=t.trigger_cleanup_timeout_sec,
        shutdown_grace_s=t.shutdown_grace_period_sec,
        ack_timeout_s=t.shared_stream_ack_timeout,
        subscriber_queue_size=t.shared_stream_subscriber_queue_size,
        cohort_grace_period_s=t.shared_stream_cohort_grace_period,
    )


async def _serve(config: Config, parts: tuple[str, ...], overrides: dict[str, Any]) -> int:
    db = Database(config.core.sql_alchemy_conn)
    await anyio.to_thread.run_sync(check_schema, db.engine)
    cipher = KwargsCipher.from_config(config.core.fernet_key, config.home)
    triggerer = Triggerer(db=db, cipher=cipher, settings=triggerer_settings(config, overrides))
    missing = [p for p in NOT_YET_AVAILABLE if p not in parts]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, triggerer.shutdown, tg.cancel_scope)
            await tg.start(_run_part, triggerer.run, tg.cancel_scope)
            logger.info(
                "Sluice ready: running %s%s",
                ", ".join(parts),
                f" (not implemented yet, not running: {', '.join(missing)})" if missing else "",
                extra={"action": "ready", "parts": list(parts)},
            )
    finally:
        db.dispose()
    return 0


async def _run_part(
    run: Any, scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    """Run one part; when it returns (graceful stop) the whole process ends."""
    try:
        await run(task_status=task_status)
    finally:
        scope.cancel()


async def _watch_signals(graceful: Any, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for signum in signals:
            count += 1
            if count == 1:
                logger.info(
                    "Received %s, shutting down gracefully (again to force)",
                    signal.Signals(signum).name,
                    extra={"action": "shutdown"},
                )
                graceful()
            else:
                logger.warning("Second signal, exiting now", extra={"action": "shutdown_forced"})
                scope.cancel()
                return


def run_engine(config: Config, *, parts: tuple[str, ...], overrides: dict[str, Any]) -> int:
    return anyio.run(_serve, config, parts, overrides)
