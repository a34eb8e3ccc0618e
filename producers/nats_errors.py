"""Where nats-py's and the socket's errors become ``producers.exceptions`` ones.

``translate_error`` (and ``translated``, the same around a block) is the one place that reads
nats-py's error classes; the cause is kept, credentials never show (nats-py's errors do not
carry them, and the address is the servers list, which holds none).
"""

from __future__ import annotations

import contextlib
import ssl
from typing import TYPE_CHECKING, Final

import nats.errors
import nats.js.errors

from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

_UNREACHABLE: Final = (
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.TimeoutError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
)
_TRANSLATED: Final = (nats.errors.Error, OSError, TimeoutError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, nats.js.errors.APIError):
        return f"{exc.description or type(exc).__name__} (code {exc.code}, {exc.err_code})"
    if isinstance(exc, nats.errors.NoServersError) and exc.__context__ is not None:
        return f"no server answered ({exc.__context__!r})"
    return str(exc) or type(exc).__name__


def _refused(exc: BaseException) -> bool:
    text = str(exc).lower()
    return (
        isinstance(exc, nats.errors.AuthorizationError | ssl.SSLError)
        or "authorization violation" in text
        or "authentication" in text
    )


def translate_error(exc: BaseException, *, action: str, address: str) -> ProducerError:
    """The ``producers.exceptions`` error for a nats-py / OS error of ``action``."""
    where = f"NATS {action} on {address}"
    detail = _describe(exc)
    if _refused(exc):
        return BrokerRefused(
            f"{where} was refused: {detail}. Check the trigger's user / password / token "
            "(or its connection) and the servers' TLS scheme",
            address=address,
        )
    if isinstance(exc, nats.js.errors.NotFoundError | nats.js.errors.BadRequestError):
        return ProducerConfigError(
            f"{where} failed: {detail}. Check the trigger's stream, durable, subjects and "
            "consumer settings (or set create_stream=True)"
        )
    if isinstance(exc, nats.errors.NoRespondersError):
        return ProducerConfigError(
            f"{where} failed: no JetStream answered. Start the server with JetStream enabled "
            "(nats-server -js) or check the account's JetStream limits"
        )
    if isinstance(exc, nats.js.errors.APIError):
        return BrokerRequestFailed(f"{where} failed: {detail}")
    if isinstance(exc, (*_UNREACHABLE, OSError, TimeoutError)):
        return BrokerUnavailable(
            f"{where} failed: cannot reach the servers ({detail}); the watchers restart with "
            "backoff. Check the trigger's servers and the network",
            address=address,
        )
    return BrokerRequestFailed(f"{where} failed: {detail}")


@contextlib.contextmanager
def translated(action: str, address: str) -> Iterator[None]:
    try:
        yield
    except _TRANSLATED as exc:
        raise translate_error(exc, action=action, address=address) from exc
