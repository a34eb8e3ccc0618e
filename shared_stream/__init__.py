"""Fan-out of one upstream poll to many sibling event triggers, with ack-mode bookkeeping.

Sibling ``BaseEventTrigger``s whose ``shared_stream_key()`` compare equal share one poll
(``SharedStreamManager``). In ack mode (``create_shared_stream_producer`` overridden) the
producer advances the broker past an event only once every subscriber of its fan-out
snapshot resolved it and every trigger event derived from it is persisted.
"""

from __future__ import annotations

from shared_stream.exceptions import (
    AckTimeout,
    DuplicateSubscription,
    InvalidSubscription,
    ManagerNotRunning,
    SharedStreamError,
    SharedStreamTerminated,
    SubscriberOverflow,
    SubscriptionError,
)
from shared_stream.keys import UnstableKeyError, stream_key_digest
from shared_stream.manager import SharedStreamManager
from shared_stream.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from shared_stream.stats import GroupStats
from shared_stream.subscriber import reject_shared_stream_event

__all__ = (
    "AckTimeout",
    "AdvanceItem",
    "AdvanceOutcome",
    "DuplicateSubscription",
    "GroupStats",
    "InvalidSubscription",
    "ManagerNotRunning",
    "SharedStreamError",
    "SharedStreamManager",
    "SharedStreamProducer",
    "SharedStreamTerminated",
    "SubscriberOverflow",
    "SubscriptionError",
    "UnstableKeyError",
    "reject_shared_stream_event",
    "stream_key_digest",
)
