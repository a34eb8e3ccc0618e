"""Logging setup; only the CLI calls it (library modules never configure handlers)."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

#: Structured fields of whatever runs in the current context: the triggerer sets it in each
#: trigger's task (trigger_id and the dag/run/task or asset/watcher it serves), so every line
#: logged there, the trigger's own included, carries them.
LOG_FIELDS: ContextVar[Mapping[str, object] | None] = ContextVar("sluice_log_fields", default=None)

#: Attributes of every LogRecord; anything else on a record came from ``extra=``.
_STANDARD_ATTRS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


#: Shorter values (e.g. a one-letter password) would blank out ordinary words.
MIN_SECRET_LEN: Final = 4


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
        if fields:
            for key, value in fields.items():
                if key not in record.__dict__:
                    setattr(record, key, value)
        return True


class RedactSecrets(logging.Filter):
    """Replaces every configured secret (Fernet keys, the database password) with ``***``
    in a record's message, arguments and ``extra=`` fields, whatever logged it."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len)[::-1]

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        message = record.getMessage()
        clean = self._redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        for key, value in record_extras(record).items():
            if isinstance(value, str) and (redacted := self._redact(value)) != value:
                setattr(record, key, redacted)
        if record.exc_info and not record.exc_text:
            record.exc_text = self._redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        return True

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def configure_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFields())
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiokafka", "botocore", "aiobotocore", "watchfiles", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
