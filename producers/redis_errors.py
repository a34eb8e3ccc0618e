"""Where redis-py's and the socket's errors become ``producers.exceptions`` ones.

``translate_error`` (and ``translated``, the same around a block) is the one place that reads
redis-py's error classes; the cause is kept, and the server is named by its address without
credentials.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Final

from redis import exceptions as redis_errors

from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
    translating,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

# Replies that mean "not now": the server is starting, busy, or a replica without a master.
_TRANSIENT_PREFIXES: Final = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")
# Replies that mean the trigger's settings cannot work against this server.
_CONFIG_PREFIXES: Final = ("WRONGTYPE", "NOPERM", "NOGROUP", "READONLY", "ERR unknown command")
_TRANSLATED: Final = (redis_errors.RedisError, OSError, TimeoutError)


def _tls_failure(exc: BaseException) -> ssl.SSLError | None:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def translate_error(exc: BaseException, *, action: str, address: str) -> ProducerError:
    """The ``producers.exceptions`` error for a redis-py / OS error of ``action``."""
    where = f"Redis {action} on {address}"
    if isinstance(
        exc,
        redis_errors.AuthenticationError
        | redis_errors.AuthorizationError
        | redis_errors.AuthenticationWrongNumberOfArgsError,
    ):
        return BrokerRefused(
            f"{where}: the server refused the login ({exc}). Check the user name and password "
            "of the trigger's url or connection",
            address=address,
        )
    if (tls := _tls_failure(exc)) is not None:
        return BrokerRefused(
            f"{where}: the TLS handshake failed ({tls}). Check rediss:// and the certificates",
            address=address,
        )
    if isinstance(exc, redis_errors.InvalidResponse):
        return BrokerRefused(
            f"{where}: the server does not speak the Redis protocol ({exc}); check the url",
            address=address,
        )
    if isinstance(exc, redis_errors.ResponseError):
        return _reply_error(exc, where, address)
    if isinstance(exc, redis_errors.DataError):
        return ProducerConfigError(f"{where}: {exc}")
    return BrokerUnavailable(
        f"{where} failed: cannot reach the server ({exc}); the watchers restart with backoff. "
        "Check the trigger's url and that redis-server runs",
        address=address,
    )


def _reply_error(exc: redis_errors.ResponseError, where: str, address: str) -> ProducerError:
    reply = str(exc)
    if reply.startswith(_TRANSIENT_PREFIXES):
        return BrokerUnavailable(
            f"{where}: the server is not ready ({reply}); the watchers restart with backoff",
            address=address,
        )
    if reply.startswith(_CONFIG_PREFIXES):
        return ProducerConfigError(
            f"{where} failed: {reply}. Check the trigger's streams (each a stream key or "
            "absent), group and the user's permissions"
        )
    return BrokerRequestFailed(f"{where} failed: {reply}")


def translated(action: str, address: str) -> AbstractContextManager[None]:
    """``translate_error`` for each redis-py / OS error the block raises."""
    return translating(_TRANSLATED, translate_error, action=action, address=address)
