"""Exceptions of the ``shared_stream`` package."""

from __future__ import annotations


class SharedStreamError(Exception):
    """Root of every error raised by the ``shared_stream`` package."""


class AckTimeout(SharedStreamError):
    """A subscriber did not resolve an event within the ack timeout; it is force-failed."""


class SubscriberOverflow(SharedStreamError):
    """A subscriber's bounded queue was full when an event was broadcast; it is failed."""


class SharedStreamTerminated(SharedStreamError):
    """The group's poll, producer factory, lane function or advance failed; the group ended."""


class SharedStreamFenced(SharedStreamError):
    """The owner of the groups lost its lease (another process may own their upstreams
    now): the group ended without advancing anything more; the broker redelivers what was
    not advanced, to the new owner."""


class SubscriptionError(SharedStreamError):
    """A subscription call was invalid (manager not running, duplicate trigger id, bad key).

    Each case is also the builtin Airflow's ``SharedStreamManager`` raises, so ported code
    that catches ``ValueError`` / ``RuntimeError`` keeps working.
    """


class InvalidSubscription(SubscriptionError, ValueError):
    """A bad argument: no ``shared_stream_key()`` (None), an unhashable or async key, or a
    trigger that is not a ``BaseEventTrigger`` (a ``ValueError``, as in Airflow)."""


class DuplicateSubscription(SubscriptionError, RuntimeError):
    """The trigger id is already subscribed to the key (a ``RuntimeError``, as in Airflow)."""


class ManagerNotRunning(SubscriptionError, RuntimeError):
    """The manager is not serving (``run()`` / ``async with`` not active, or it is in
    ``stop_all()`` / ``aclose()``): nothing can be subscribed now (a ``RuntimeError``)."""
