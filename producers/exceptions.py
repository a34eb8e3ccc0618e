"""Exceptions of the ``producers`` package (broker adapters translate their errors here)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from triggers.exceptions import UpstreamRefused, UpstreamUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class ProducerError(Exception):
    """Root of every error raised by the ``producers`` package."""


class BrokerUnavailable(ProducerError, UpstreamUnavailable):
    """The broker cannot be reached; the caller retries with backoff.

    ``address`` names the broker (the Kafka bootstrap servers, the SQS queue URL): the
    triggerer's one warning for a watcher whose broker is down shows it.
    """


class ProducerConfigError(ProducerError):
    """A producer or event trigger was configured in a way that cannot work."""


class BrokerRefused(ProducerConfigError, UpstreamRefused):
    """The broker refused the connection: a SASL login or a TLS handshake failed, or it
    speaks another protocol. ``address`` names the broker; fix the security settings."""


class BrokerRequestFailed(ProducerError):
    """The broker refused a request (or entries of a batch) for a reason retrying won't fix.

    The shared-stream group ends and restarts; whatever was not advanced is redelivered.
    """


class EventFilterError(ProducerError):
    """An event trigger's filter cannot evaluate a message (e.g. a malformed body).

    The trigger rejects the message (``reject_shared_stream_event()``) instead of failing.
    """


class UncleanEventError(ProducerError):
    """A message was not cleanly delivered and the producer is set to stop on it.

    Raised from ``advance`` (Kafka ``on_unclean="stop"``): the shared-stream group ends,
    nothing past the message is committed, and the broker redelivers it.
    """


@contextlib.contextmanager
def translating(
    errors: tuple[type[BaseException], ...],
    translate: Callable[..., ProducerError],
    **context: str,
) -> Iterator[None]:
    """Raise ``translate(exc, **context)`` for each of ``errors`` the block raises, the
    client's error kept as its ``__cause__`` (each adapter's ``translated``)."""
    try:
        yield
    except errors as exc:
        raise translate(exc, **context) from exc
