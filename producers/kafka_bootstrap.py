"""Why an aiokafka bootstrap failed: the per-server errors it only logs, captured.

aiokafka's ``bootstrap()`` catches every server's failure (a refused connection, a SASL
login refused, a TLS handshake error, a protocol mismatch), logs it on the ``aiokafka``
logger as ``Unable connect to "host:port": <error>`` or ``Unable to request metadata from
"host:port": <error>``, and raises ``KafkaConnectionError("Unable to bootstrap from ...")``
with no cause. ``capture_bootstrap_errors()`` records those lines (with the error objects)
for the bootstrap that runs inside it, in the same task: the caller then says *why* in the
error it raises (``translate_kafka_error(..., bootstrap=...)``), and the captured lines are
not logged a second time. Lines of a bootstrap that runs outside a capture go to the log.
"""

from __future__ import annotations

import logging
import re
import ssl
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aiokafka import errors as kafka_errors

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

#: the templates of aiokafka's per-server bootstrap failures (args: host, port, error)
BOOTSTRAP_TEMPLATES: Final = frozenset(
    {'Unable connect to "%s:%s": %s', 'Unable to request metadata from "%s:%s": %s'}
)
#: errors that mean "the broker answered and refused us": retrying does not help
_REFUSALS: Final = (
    ssl.SSLError,
    ssl.CertificateError,
    kafka_errors.AuthenticationFailedError,
    kafka_errors.AuthenticationMethodNotSupported,
    kafka_errors.SaslAuthenticationFailed,
    kafka_errors.UnsupportedSaslMechanismError,
    kafka_errors.IllegalSaslStateError,
    kafka_errors.UnsupportedVersionError,
    kafka_errors.IncompatibleBrokerVersion,
    kafka_errors.UnrecognizedBrokerVersion,
)
_REFUSAL_WORDS: Final = re.compile(r"sasl|ssl|tls|authenticat|certificate|handshake", re.I)


@dataclass(frozen=True, slots=True)
class BootstrapFailure:
    """One server's failure during a bootstrap, as aiokafka logged it."""

    server: str  # host:port
    error: object  # the exception aiokafka caught (or its text)
    line: str  # the formatted log line

    @property
    def detail(self) -> str:
        error = self.error
        if isinstance(error, BaseException):
            text = str(error) or repr(error)
            return f"{type(error).__name__}: {text}"
        return str(error)

    @property
    def is_refusal(self) -> bool:
        """The broker refused the login or the TLS handshake (or speaks another protocol)."""
        if isinstance(self.error, _REFUSALS):
            return True
        name = type(self.error).__name__ if isinstance(self.error, BaseException) else ""
        return bool(_REFUSAL_WORDS.search(f"{name} {self.error}"))


class _Capture:
    """The failures recorded by one ``capture_bootstrap_errors()``, while it is open (the
    background tasks aiokafka starts inside it inherit the context, not the capture)."""

    __slots__ = ("failures", "open")

    def __init__(self) -> None:
        self.failures: list[BootstrapFailure] = []
        self.open = True


_capture: ContextVar[_Capture | None] = ContextVar("sluice_kafka_bootstrap_capture", default=None)


class _CaptureBootstrapLines(logging.Filter):
    """On the ``aiokafka`` logger: a bootstrap failure line inside a capture is recorded
    (and not logged: the caller reports it); any other line passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        capture = _capture.get()
        if capture is None or not capture.open or str(record.msg) not in BOOTSTRAP_TEMPLATES:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) != 3:
            return True
        host, port, error = args
        capture.failures.append(BootstrapFailure(f"{host}:{port}", error, record.getMessage()))
        return False


_FILTER: Final = _CaptureBootstrapLines()


def install() -> None:
    """Put the capturing filter on aiokafka's logger (once; idempotent)."""
    kafka_logger = logging.getLogger("aiokafka")
    if _FILTER not in kafka_logger.filters:
        kafka_logger.addFilter(_FILTER)


@contextmanager
def capture_bootstrap_errors() -> Iterator[list[BootstrapFailure]]:
    """The per-server failures of the aiokafka bootstraps run inside, in order."""
    install()
    capture = _Capture()
    token = _capture.set(capture)
    try:
        yield capture.failures
    finally:
        capture.open = False
        _capture.reset(token)


def describe(failures: Sequence[BootstrapFailure]) -> str:
    """The last failure of each server, ``host:port: Error: text; ...``."""
    last = {failure.server: failure for failure in failures}
    return "; ".join(f"{server}: {failure.detail}" for server, failure in last.items())
