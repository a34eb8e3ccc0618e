"""Exceptions of the ``shared_stream`` package."""

from __future__ import annotations


class SharedStreamError(Exception):
    """Root of every error raised by the ``shared_stream`` package."""


class AckTimeout(SharedStreamError):  # noqa: N818 - public name kept from Airflow
    """A subscriber did not resolve an event within the ack timeout; it is force-failed."""


class SubscriberOverflow(SharedStreamError):  # noqa: N818 - public name kept from Airflow
    """A subscriber's bounded queue was full when an event was broadcast; it is failed."""


class SharedStreamTerminated(SharedStreamError):  # noqa: N818
    """The group's poll, producer factory, lane function or advance failed; the group ended."""
