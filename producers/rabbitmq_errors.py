"""Where aiormq's (aio-pika's) and the socket's errors become ``producers.exceptions`` ones.

``translated`` is the one place that reads the AMQP client's error classes; the cause is
kept, and the broker's address is shown without its credentials.

aiormq also logs at ERROR a failed connect (``error when creating transport``) and a
connection the broker closed (``Unexpected connection close from remote``, and a warning
with a traceback as its reader ends), then raises:
``quiet_connect_errors()`` puts a filter on its logger that makes those lines DEBUG, as the
error raised is translated here and reported once by the triggerer (a watcher whose broker
is down says so in one warning, then retries quietly).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any, Final

from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

#: aiormq's ERROR lines for a connection it raises about right after
_RAISED_TEMPLATES: Final = (
    "error when creating transport: %r",
    'Unexpected connection close from remote "%s", ',
)


#: its WARNING (with a traceback) when its reader ends on an error: a lost connection is
#: raised too; any other error (a malformed frame) stays a warning
_READER_FAILED: Final = "Cancelling cause reader exited abnormally"


class _DebugWhatIsRaised(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        lost = (
            message == _READER_FAILED
            and record.exc_info is not None
            and isinstance(record.exc_info[1], OSError)  # aiormq's connection errors too
        )
        if lost or message.startswith(_RAISED_TEMPLATES):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_FILTER: Final = _DebugWhatIsRaised()


def quiet_connect_errors() -> None:
    """Make aiormq's ERROR lines for a lost or failed connection DEBUG (idempotent)."""
    client_logger = logging.getLogger("aiormq.connection")
    if _FILTER not in client_logger.filters:
        client_logger.addFilter(_FILTER)


@functools.cache
def _amqp() -> Any:
    """aiormq's exceptions, imported on first use: by then ``producers.rabbitmq`` imported
    the client in a worker thread (importing it costs the event loop 0.2 s)."""
    from aiormq import exceptions

    return exceptions


def _translated_types() -> tuple[type[BaseException], ...]:
    amqp = _amqp()
    return (amqp.AMQPError, amqp.ChannelInvalidStateError, OSError, asyncio.TimeoutError)


def translate_error(exc: BaseException, *, action: str, address: str, queue: str) -> ProducerError:
    """The ``producers.exceptions`` error for an AMQP client / OS error of ``action``."""
    amqp = _amqp()
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
    except Exception as exc:
        if not isinstance(exc, _translated_types()):
            raise
        raise translate_error(exc, action=action, address=address, queue=queue) from exc
