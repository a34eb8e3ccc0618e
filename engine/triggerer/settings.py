"""The triggerer's settings: plain values, read from the configuration by the supervisor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from engine.triggerer.collector import DEFAULT_YOUNG_THRESHOLD
from engine.triggerer.runtime import DEFAULT_RESTART_BACKOFF_S

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ("CLAIM_IDLE_INTERVAL_S", "NEW_TRIGGER_POLL_S", "TriggererSettings")

CLAIM_IDLE_INTERVAL_S: Final = 1.0
NEW_TRIGGER_POLL_S: Final = 0.1
COHORT_RETURN_MARGIN_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class TriggererSettings:
    capacity: int = 1000
    heartbeat_s: float = 5.0
    health_check_threshold_s: float = 10.5
    allowed_modules: tuple[str, ...] = ("triggers", "producers")
    plugins_folder: Path | None = None
    blocked_threshold_s: float = 0.2
    cleanup_interval_s: float = 60.0
    cleanup_timeout_s: float = 10.0
    shutdown_grace_s: float = 30.0
    ack_timeout_s: float = 300.0
    subscriber_queue_size: int = 1024
    cohort_grace_period_s: float = 0.0
    # a failed watcher's restart backoff: (first, most) seconds, doubling in between
    restart_backoff_s: tuple[float, float] = DEFAULT_RESTART_BACKOFF_S
    claim_idle_interval_s: float = CLAIM_IDLE_INTERVAL_S
    new_trigger_poll_s: float = NEW_TRIGGER_POLL_S
    max_asset_event_payload_bytes: int | None = 1_048_576
    keep_events_while_paused: bool = True
    # gc young-generation threshold while running (None: the interpreter's); see collector
    gc_young_threshold: int | None = DEFAULT_YOUNG_THRESHOLD

    @property
    def cohort_return_s(self) -> float:
        """How long a shared-stream group waits for a watcher that failed (it fans nothing
        out meanwhile): its first restart backoff, plus five seconds for its start."""
        return self.restart_backoff_s[0] + COHORT_RETURN_MARGIN_S
