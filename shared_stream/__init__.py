"""Fan-out of one upstream poll to many sibling event triggers, with ack-mode bookkeeping.

Sibling ``BaseEventTrigger``s whose ``shared_stream_key()`` compare equal share one poll
(``SharedStreamManager``). In ack mode (``create_shared_stream_producer`` overridden) the
producer advances the broker past an event only once every subscriber of its fan-out
snapshot resolved it and every trigger event derived from it is persisted.

May import ``triggers`` only; imported by ``producers`` and the engine's triggerer. The
names below load on first use (PEP 562 ``__getattr__``, as in ``triggers``): a DAG file
whose trigger class needs ``shared_stream.producer`` does not import the manager and its
async machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from triggers.lazy import load_on_first_use

if TYPE_CHECKING:
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

#: public name -> the module that defines it
_MODULE_OF: Final[dict[str, str]] = {
    "AckTimeout": "shared_stream.exceptions",
    "AdvanceItem": "shared_stream.producer",
    "AdvanceOutcome": "shared_stream.producer",
    "DuplicateSubscription": "shared_stream.exceptions",
    "GroupStats": "shared_stream.stats",
    "InvalidSubscription": "shared_stream.exceptions",
    "ManagerNotRunning": "shared_stream.exceptions",
    "SharedStreamError": "shared_stream.exceptions",
    "SharedStreamManager": "shared_stream.manager",
    "SharedStreamProducer": "shared_stream.producer",
    "SharedStreamTerminated": "shared_stream.exceptions",
    "SubscriberOverflow": "shared_stream.exceptions",
    "SubscriptionError": "shared_stream.exceptions",
    "UnstableKeyError": "shared_stream.keys",
    "reject_shared_stream_event": "shared_stream.subscriber",
    "stream_key_digest": "shared_stream.keys",
}

__all__: tuple[str, ...] = (
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


if not TYPE_CHECKING:  # type checkers read the imports above: a misspelt name is an error
    __getattr__, __dir__ = load_on_first_use(__name__, _MODULE_OF)
