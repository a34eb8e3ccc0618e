"""Exceptions of the ``triggers`` package: one root, subclasses by how the caller reacts."""

from __future__ import annotations

import errno
import socket
from typing import Final


class TriggerError(Exception):
    """Root of every error raised by the ``triggers`` package."""


class SerializationError(TriggerError, TypeError):
    """A value cannot be serialized (trigger kwargs, event payloads, next_kwargs)."""


class TriggerContractError(TriggerError):
    """A trigger broke its contract (e.g. ``run()`` returned instead of yielding)."""


class MissingExtraError(TriggerError, ImportError):
    """A package this code needs is not installed: the message names what needs it, the
    package and the extra of the ``sluice`` distribution that installs it
    (``triggers.extras``). Installing the extra fixes it; retrying does not."""


class UpstreamUnavailable(TriggerError):
    """What a trigger reads (a broker, an endpoint) cannot be reached now; retrying may work.

    The triggerer treats it as an expected condition, not a bug: a watcher that fails with
    it logs one warning naming ``address`` and its backoff, then retries quietly (DEBUG)
    until it connects. Raise it (or a subclass, such as ``producers``' ``BrokerUnavailable``)
    from a trigger when the other side is down, unreachable, or timing out.
    """

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


class UpstreamRefused(TriggerError):
    """What a trigger reads answered and refused it: a login or a TLS handshake failed, it
    speaks another protocol. Retrying does not help until the settings change.

    The triggerer logs it as an ERROR with its cause once per distinct error in a watcher's
    streak of failures (the restarts after it, failing the same way, are DEBUG lines).
    """

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


#: OS error numbers that mean "the other side cannot be reached" (refused, reset, no route),
#: as the socket calls set them (a ``TimeoutError`` of a connect carries ETIMEDOUT)
_UNREACHABLE_ERRNOS: Final = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
        errno.ENETDOWN,
        errno.ETIMEDOUT,
        errno.EPIPE,
    }
)


def is_upstream_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the upstream cannot be reached (a retry may work).

    Only ``UpstreamUnavailable`` (the producers raise it naming the address, their own
    connect timeouts included) and the socket's own failures: a refused connection, a DNS
    resolution failure (``socket.gaierror``), an ``OSError`` carrying an unreachable errno
    (refused, reset, no route, a connect timing out). A ``TimeoutError`` or
    ``ConnectionError`` raised without an errno (a trigger's own ``asyncio.timeout``, an
    HTTP client's error class) is not: it may be a bug, reported with its traceback. An
    exception group is unavailable when every error in it is.
    """
    if isinstance(exc, BaseExceptionGroup):  # a producer's task group ended with it
        return all(is_upstream_unavailable(inner) for inner in exc.exceptions)
    if isinstance(exc, UpstreamUnavailable | ConnectionRefusedError | socket.gaierror):
        return True
    return isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS


def is_reported_by_the_trigger(exc: BaseException) -> bool:
    """True for the upstream conditions the triggerer reports itself, quietly on repeat
    (``is_upstream_unavailable``, ``UpstreamRefused``): whoever else sees ``exc`` (a shared
    stream group ending with it) says it at DEBUG only."""
    return is_upstream_unavailable(exc) or isinstance(exc, UpstreamRefused)


def upstream_address(exc: BaseException) -> str | None:
    """The address an ``UpstreamUnavailable`` or ``UpstreamRefused`` names (None for others;
    for an exception group, the first address its errors name)."""
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(upstream_address, exc.exceptions)), None)
    return exc.address if isinstance(exc, UpstreamUnavailable | UpstreamRefused) else None
