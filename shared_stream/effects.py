"""The effects ``AckLedger`` returns for its async driver to carry out (commands, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Hashable

    from shared_stream.producer import AdvanceItem


class FailReason(enum.Enum):
    """Why a subscriber is force-failed."""

    ACK_TIMEOUT = "ack_timeout"
    OVERFLOW = "overflow"


@dataclass(frozen=True, slots=True)
class AdvanceBatch:
    """Effect: call ``producer.advance(items)``, then ``advance_done(batch)``.

    ``seqs`` are the event seqs of ``items``, in order (one lane's contiguous prefix).
    """

    lane: Hashable
    items: tuple[AdvanceItem, ...]
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FailSubscriber:
    """Effect: the subscriber's stream must raise (``AckTimeout`` / ``SubscriberOverflow``)."""

    trigger_id: int
    reason: FailReason


@dataclass(frozen=True, slots=True)
class ReleaseBindings:
    """Effect: these binding seqs will never count again; forget any routing kept for them."""

    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AbandonEvents:
    """Effect: these events will never be advanced (group stopped); the broker redelivers."""

    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ExpireDeparted:
    """Effect: a subscriber that already left (its trigger stopped or was replaced) did not
    get its trigger events confirmed persisted within the ack timeout: its ``events`` fail.

    There is no stream left to fail: the driver counts it as an ack timeout and reports it.
    """

    trigger_id: int
    events: int


Effect: TypeAlias = AdvanceBatch | FailSubscriber | ReleaseBindings | AbandonEvents | ExpireDeparted
