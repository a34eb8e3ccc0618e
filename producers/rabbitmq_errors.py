"""Where aiormq's (aio-pika's) and the socket's errors become ``producers.exceptions`` ones.

``translated`` is the one place that reads the AMQP client's error classes; the cause is
kept, and the broker's address is shown without its credentials.

aiormq also logs a failed connect at ERROR (``error when creating transport: ...``) before
it raises: ``quiet_connect_errors()`` puts a filter on its logger that drops that line, as
the error it raises is translated here and reported once by the triggerer (a watcher whose
broker is down says so in one warning, then retries quietly).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Final

from aiormq import exceptions as amqp

from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

#: aiormq's line for a failed connect, which it raises right after
_CONNECT_FAILED_TEMPLATE: Final = "error when creating transport: %r"


class _DropConnectFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _CONNECT_FAILED_TEMPLATE


_FILTER: Final = _DropConnectFailures()


def quiet_connect_errors() -> None:
    """Drop aiormq's ERROR line for a connect that fails (idempotent)."""
    client_logger = logging.getLogger("aiormq.connection")
    if _FILTER not in client_logger.filters:
        client_logger.addFilter(_FILTER)


_TRANSLATED: Final = (
    amqp.AMQPError,
    amqp.ChannelInvalidStateError,
    OSError,
    asyncio.TimeoutError,
)


def translate_error(exc: BaseException, *, action: str, address: str, queue: str) -> ProducerError:
    """The ``producers.exceptions`` error for an AMQP client / OS error of ``action``."""
    where = f"RabbitMQ {action} on queue {queue!r} at {address}"
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, amqp.AuthenticationError | amqp.ProbableAuthenticationError):
        return BrokerRefused(
            f"{where}: the broker refused the login ({detail}); check the user, password and "
            "virtual host of the trigger's url or connection",
            address=address,
        )
    if isinstance(exc, amqp.IncompatibleProtocolError):
        return BrokerRefused(
            f"{where}: the server does not speak AMQP 0-9-1 ({detail}); check the port",
            address=address,
        )
    if isinstance(exc, amqp.ConnectionNotAllowed | amqp.ChannelAccessRefused):
        return BrokerRefused(
            f"{where}: access refused ({detail}); give the user permissions on the virtual "
            "host and queue",
            address=address,
        )
    if isinstance(exc, amqp.ChannelNotFoundEntity):
        return ProducerConfigError(
            f"{where}: {detail}. Create the queue, or set declare=True to declare it"
        )
    if isinstance(exc, amqp.ChannelPreconditionFailed):
        return ProducerConfigError(
            f"{where}: {detail}. The queue exists with other arguments than queue_arguments "
            "(or the settings are wrong): make them agree"
        )
    if isinstance(exc, amqp.ChannelClosed | amqp.ProtocolSyntaxError | amqp.MethodNotImplemented):
        return BrokerRequestFailed(f"{where} failed: {detail}")
    return BrokerUnavailable(
        f"{where} failed: cannot reach the broker or lost it ({detail}); the watchers restart "
        "with backoff and the broker redelivers what was not acknowledged",
        address=address,
    )


@contextlib.contextmanager
def translated(action: str, *, address: str, queue: str) -> Iterator[None]:
    try:
        yield
    except _TRANSLATED as exc:
        raise translate_error(exc, action=action, address=address, queue=queue) from exc
