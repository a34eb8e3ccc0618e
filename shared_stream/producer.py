"""The ack-mode producer port: what a broker adapter implements to share one upstream.

A ``SharedStreamProducer`` owns the broker connection of one shared-stream group. The
manager drives ``open_stream()`` once, hands every raw event to the group's subscribers, and
calls ``advance(batch)`` with the contiguous resolved prefix of a lane once every subscriber
of each event's fan-out snapshot resolved it. ``aclose()`` is called once when the group
ends, whatever happened.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Sequence


@dataclass(frozen=True, slots=True)
class AdvanceOutcome:
    """How the subscribers of one event's fan-out snapshot resolved it.

    ``acked``: moved past it with every derived trigger event persisted. ``failed``: ack
    timeout, queue overflow, or unsubscribed before pulling it (redeliver). ``rejected``:
    refused it with ``reject_shared_stream_event()`` (dead-letter / nack).
    """

    acked: int
    failed: int
    rejected: int = 0

    @property
    def is_clean(self) -> bool:
        """True when every subscriber accepted the event (and there was at least one)."""
        return self.failed == 0 and self.rejected == 0 and self.acked > 0

    @property
    def subscriber_count(self) -> int:
        """Size of the event's fan-out snapshot."""
        return self.acked + self.failed + self.rejected


class AdvanceItem(NamedTuple):
    """One event of an advance batch: ``for broker_payload, outcome in batch`` works."""

    broker_payload: Any
    outcome: AdvanceOutcome


class SharedStreamProducer(abc.ABC):
    """An ack-mode upstream: yields raw events, later advances the broker past them.

    Open the connection lazily inside ``open_stream`` (the factory only builds the object).
    If ``open_stream``, ``get_advance_lane`` or ``advance`` raises, the whole group is
    terminated: subscribers get the error, nothing more is advanced, ``aclose()`` runs once
    and the broker redelivers whatever was never advanced.
    """

    @abc.abstractmethod
    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Yield ``(raw_event, broker_payload)`` for the group's whole lifetime."""

    @abc.abstractmethod
    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit / delete / ack one lane's contiguous resolved prefix, in event order.

        At most one call is awaited at a time per group; the next batch of the same lane
        comes only after this one returned.
        """

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The ordering lane of an event (e.g. a Kafka ``(topic, partition)``); one lane by default.

        Events of different lanes are advanced independently; within a lane, strictly in
        order.
        """
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release the broker connection; called once when the group ends."""

    def fence(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """The process lost its ownership of the stream (another may own it now): from now
        on never acknowledge anything, and stop taking part in the broker's consumer
        membership at once (e.g. leave a consumer group), synchronously. ``advance`` is not
        called after it; ``aclose()`` still is (release, never ack, there)."""
