"""Whether a Kafka consumer still reaches its broker: ``BrokerLiveness``.

aiokafka retries a lost broker inside the consumer, for ever: ``getmany`` keeps returning
nothing, the coordinator keeps looking for itself, and no error reaches the caller. A group
whose broker is gone would then look like a quiet topic. ``BrokerLiveness`` tells the two
apart from aiokafka's public API, after each fetch that returned nothing:

- a sign of life is a fetch that returned records, a fetch response for an assigned
  partition (``last_poll_timestamp``: aiokafka stamps every response, empty ones too; an
  idle consumer gets one every ``fetch_max_wait_ms``), or a metadata request answered;
- when the last sign of life is older than ``lost_after_s``, one metadata request is sent
  (``consumer.topics()``, bounded by ``lost_after_s`` too): answered, the broker is alive (a
  consumer with no partition, or one rebalancing); refused or unanswered, the broker is
  unreachable and ``check`` raises ``BrokerUnavailable`` with its address: the group ends,
  each watcher says so once, and the triggerer restarts them with its backoff.

In the common case (an assigned partition fetched recently) a check reads a few numbers and
sends nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import anyio
from aiokafka import errors as kafka_errors

from producers.exceptions import BrokerUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable

#: the default bound is the group's session timeout (past it the coordinator dropped the
#: member anyway), but never below this: a loaded machine may take a second to answer
MIN_LOST_AFTER_S: Final = 2.0


def lost_after_default(session_timeout_ms: int) -> float:
    """The default ``lost_after_s`` of a consumer with this session timeout."""
    return max(session_timeout_ms / 1000, MIN_LOST_AFTER_S)


class BrokerLiveness:
    """The last sign of life of one consumer's broker; see the module docstring."""

    __slots__ = ("_alive_at", "_clock", "_wall", "lost_after_s", "probes")

    def __init__(
        self,
        lost_after_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if lost_after_s <= 0:
            raise ValueError(f"lost_after_s must be > 0, got {lost_after_s}")
        self.lost_after_s = lost_after_s
        self._clock, self._wall = clock, wall
        self._alive_at = clock()
        self.probes = 0

    def alive(self) -> None:
        """A sign of life (records fetched, the consumer started)."""
        self._alive_at = self._clock()

    def _silent_for(self, consumer: Any) -> float:
        """Seconds since the last sign of life, fetch responses of assigned partitions
        included."""
        silent = self._clock() - self._alive_at
        polled = [consumer.last_poll_timestamp(tp) for tp in consumer.assignment()]
        stamps = [stamp for stamp in polled if stamp is not None]
        if stamps:
            silent = min(silent, self._wall() - max(stamps) / 1000)
        return silent

    async def check(self, consumer: Any, *, where: str, address: str) -> None:
        """After a fetch that returned nothing: raise ``BrokerUnavailable`` when the broker
        gave no sign of life for ``lost_after_s`` and does not answer a metadata request."""
        if self._silent_for(consumer) <= self.lost_after_s:
            return
        self.probes += 1
        try:
            with anyio.fail_after(self.lost_after_s):
                await consumer.topics()
        except (TimeoutError, kafka_errors.KafkaError) as exc:
            raise BrokerUnavailable(
                f"the Kafka broker is unreachable at {where}: no fetch response nor metadata "
                f"for more than {self.lost_after_s:g}s ({type(exc).__name__}: {exc}); check "
                "that the broker is up (the watchers restart with backoff)",
                address=address,
            ) from exc
        self.alive()

    def __repr__(self) -> str:
        silent = self._clock() - self._alive_at
        return (
            f"<BrokerLiveness lost_after_s={self.lost_after_s:g} "
            f"silent_s={silent:.1f} probes={self.probes}>"
        )
