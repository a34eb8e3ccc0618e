"""Logging setup; only the CLI calls it (library modules never configure handlers)."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Protocol
from urllib.parse import quote, quote_plus

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


class LogFields(Protocol):
    """Fields for the lines logged in a context: a mapping, or anything with ``items()``
    (the triggerer's per-trigger handle, which builds them only when a line is logged)."""

    def items(self) -> Iterable[tuple[str, object]]: ...


#: Structured fields of whatever runs in the current context: the triggerer sets it in each
#: trigger's task (trigger_id and the dag/run/task or asset/watcher it serves), so every line
#: logged there, the trigger's own included, carries them.
LOG_FIELDS: ContextVar[LogFields | None] = ContextVar("sluice_log_fields", default=None)

#: Attributes of every LogRecord; anything else on a record came from ``extra=``.
_STANDARD_ATTRS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


#: Shorter values (e.g. a one-letter password) would blank out ordinary words.
MIN_SECRET_LEN: Final = 4
REDACTED: Final = "***"
REDACTED_BYTES: Final = b"***"


def record_extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the ``extra=`` fields at top level."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(record_extras(record))
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:  # already formatted (and redacted) by RedactSecrets
            doc["exc_info"] = record.exc_text
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """Human lines; structured fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = record_extras(record)
        if extras:
            line += " [" + " ".join(f"{k}={v}" for k, v in sorted(extras.items())) + "]"
        return line


class ContextFields(logging.Filter):
    """Adds ``LOG_FIELDS`` of the current context to a record (explicit extras win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = LOG_FIELDS.get()
        if fields is not None:
            for key, value in fields.items():
                if key not in record.__dict__:
                    setattr(record, key, value)
        return True


def secret_forms(secrets: Iterable[str]) -> list[str]:
    """Each secret as it may appear in text: as is, and percent-encoded as in a URL
    (``p@ss`` is ``p%40ss`` in ``postgresql://u:p%40ss@host/db``); longest first, so that a
    secret containing another is replaced whole. Too-short values are left out."""
    forms = set()
    for secret in secrets:
        if len(secret) >= MIN_SECRET_LEN:
            forms |= {secret, quote(secret, safe=""), quote_plus(secret)}
    return sorted(forms, key=len, reverse=True)


#: engine settings a child process (a task, a DAG file's parse) must not inherit: its code
#: could print them
SECRET_ENVIRONMENT: Final = ("SLUICE__CORE__FERNET_KEY", "SLUICE__CORE__SQL_ALCHEMY_CONN")


def child_environment(environ: Mapping[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """``environ`` without the engine's secrets: the Fernet key and database URL settings,
    and any other ``SLUICE__`` setting whose value holds a configured secret."""
    forms = secret_forms(secrets)
    return {
        name: value
        for name, value in environ.items()
        if name not in SECRET_ENVIRONMENT
        and not (name.startswith("SLUICE__") and any(form in value for form in forms))
    }


class Redactor:
    """Replaces every form of the configured secrets with ``***`` in text or bytes."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.forms = secret_forms(secrets)
        self._byte_forms = [form.encode() for form in self.forms]
        #: bytes a secret can span: what ``StreamRedactor`` holds back between chunks
        self.longest = max((len(form) for form in self._byte_forms), default=0)

    def __bool__(self) -> bool:
        return bool(self.forms)

    def text(self, text: str) -> str:
        for form in self.forms:
            text = text.replace(form, REDACTED)
        return text

    def bytes(self, data: bytes) -> bytes:
        for form in self._byte_forms:
            data = data.replace(form, REDACTED_BYTES)
        return data

    def value(self, value: object) -> object:
        """Strings redacted inside lists, tuples and dicts (keys too); other values as is."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return type(value)(self.value(v) for v in value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        return value


class StreamRedactor:
    """Redacts a byte stream that arrives in chunks (a task's output): complete lines go
    out at once; of an unfinished line, all but the last bytes a secret could still span."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._redactor:
            return chunk
        data = self._redactor.bytes(self._pending + chunk)
        # Hold back the unfinished line, at most the bytes a secret could still span.
        cut = max(data.rfind(b"\n") + 1, len(data) - (self._redactor.longest - 1))
        out, self._pending = data[:cut], data[cut:]
        return out

    @property
    def redactor(self) -> Redactor:
        """The redactor in use (for text outside the stream)."""
        return self._redactor

    def use(self, redactor: Redactor) -> None:
        """Redact with ``redactor`` from now on (more secrets became known)."""
        self._redactor = redactor

    def flush(self) -> bytes:
        out, self._pending = self._redactor.bytes(self._pending), b""
        return out


class RedactSecrets(logging.Filter):
    """Replaces every configured secret (Fernet keys, the database password) with ``***``
    in a record's message, arguments, ``extra=`` fields (nested ones too), traceback and
    stack, whatever logged it."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._redactor = Redactor(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        redact = self._redactor
        if not redact:
            return True
        message = record.getMessage()
        clean = redact.text(message)
        if clean != message:
            record.msg, record.args = clean, None
        for key, value in record_extras(record).items():
            if (redacted := redact.value(value)) != value:
                setattr(record, key, redacted)
        if record.exc_info and not record.exc_text:
            record.exc_text = redact.text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact.text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact.text(record.stack_info)
        return True


#: a library line repeated within this many seconds is dropped (e.g. aiokafka's reconnects)
LIBRARY_REPEAT_WINDOW_S: Final = 300.0


class QuietLibraries(logging.Filter):
    """Keeps the retry loops of the broker libraries from flooding the log.

    aiokafka logs every failed connection attempt at ERROR, and retries every 100 ms or so
    on its own. A line of these libraries goes through once per ``LIBRARY_REPEAT_WINDOW_S``
    per logger and *formatted* message: the same failure repeated is dropped, a different
    one (another host, another error) is shown. (The per-server failures of a bootstrap
    the Kafka producer runs are not logged here at all: ``producers.kafka_bootstrap``
    captures them into the error the watcher reports.)
    """

    LIBRARIES: Final = ("aiokafka", "botocore", "aiobotocore")

    def __init__(self, window_s: float = LIBRARY_REPEAT_WINDOW_S) -> None:
        super().__init__()
        self._window_s = window_s
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if not name.startswith(self.LIBRARIES) or record.levelno < logging.WARNING:
            return True
        key = (name, record.getMessage())
        last = self._last.get(key)
        if last is not None and record.created - last < self._window_s:
            return False
        if len(self._last) > 1000:  # bounded: never grows forever
            self._last.clear()
        self._last[key] = record.created
        return True


def configure_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(QuietLibraries())
    handler.addFilter(ContextFields())
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiokafka", "botocore", "aiobotocore", "watchfiles", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
