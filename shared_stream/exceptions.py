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


class SubscriptionError(SharedStreamError):
    """A subscription call was invalid (manager not running, duplicate trigger id, bad key)."""
