"""The effective configuration: the ``Config`` of every section, where each value came
from, what of it is secret (redacted for display, masked in logs), and its display
(``sluice config``).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from engine.config.sections import (
    SCHEMA,
    ApiConfig,
    CeleryConfig,
    CoreConfig,
    ExecutorConfig,
    LoggingConfig,
    MetricsConfig,
    OperatorsConfig,
    SchedulerConfig,
    StateStoreConfig,
    TriggererConfig,
    split_items,
)
from engine.config.urls import REDACTED, redact_url, url_secrets

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    _Key = tuple[str, str]  # (section, key)

DEFAULT_SOURCE: Final = "default"

#: A secret key -> how its value is shown (``REDACTED``, or its URL without the password).
REDACTORS: Final[dict[_Key, Callable[[str], str]]] = {
    ("core", "fernet_key"): lambda value: REDACTED if value else "",
    ("core", "sql_alchemy_conn"): redact_url,
    ("celery", "broker_url"): lambda value: redact_url(value) if value else "",
    ("celery", "result_backend"): lambda value: redact_url(value) if value else "",
}
SECRET_KEYS: Final[frozenset[tuple[str, str]]] = frozenset(REDACTORS)


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration, with where each value came from."""

    home: Path
    config_file: Path
    core: CoreConfig
    triggerer: TriggererConfig
    scheduler: SchedulerConfig
    operators: OperatorsConfig
    metrics: MetricsConfig
    logging: LoggingConfig
    api: ApiConfig
    sources: Mapping[tuple[str, str], str]
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    celery: CeleryConfig = field(default_factory=CeleryConfig)
    state_store: StateStoreConfig = field(default_factory=StateStoreConfig)
    #: where ``home`` came from: ``env SLUICE_HOME``, the ``home`` argument, or the default
    #: (``~/.sluice``); a command that finds no database says it, as the sources of keys
    home_source: str = DEFAULT_SOURCE

    def secret_values(self) -> list[str]:
        """Values that must never reach a log line: the Fernet keys (configured, or in the
        home's key file), the database password."""
        from engine.crypto import FERNET_KEY_FILENAME

        values = list(split_items(self.core.fernet_key.split(",")))
        key_file = self.home / FERNET_KEY_FILENAME
        if not values and key_file.is_file():
            with contextlib.suppress(OSError, UnicodeError):
                values += split_items(key_file.read_text().split(","))
        for text in (
            self.core.sql_alchemy_conn,
            self.celery.broker_url,
            self.celery.result_backend,
        ):
            values += url_secrets(text)
        return values

    def as_dict(self, *, redact: bool = True) -> dict[str, dict[str, Any]]:
        """Section -> key -> value, JSON-friendly; an unset optional key is None."""
        result: dict[str, dict[str, Any]] = {name: {} for name in SCHEMA}
        for name, schema in SCHEMA.items():
            for key in schema:
                value = getattr(getattr(self, name), key)
                if redact and (name, key) in REDACTORS:
                    value = REDACTORS[(name, key)](value)
                is_path, is_tuple = isinstance(value, Path), isinstance(value, tuple)
                result[name][key] = str(value) if is_path else list(value) if is_tuple else value
        return result


def render_config(config: Config) -> str:
    """TOML-like text of the effective (redacted) config, each key with its source."""
    found = "" if config.config_file.is_file() else " (not found)"
    lines = [f"# Sluice home: {config.home}", f"# Config file: {config.config_file}{found}"]
    values = config.as_dict(redact=True)
    for name, schema in SCHEMA.items():
        lines += ["", f"[{name}]"]
        for key, (fld, _) in schema.items():
            value, note = values[name][key], ""
            if value is None and (effective := fld.metadata["effective"]) is not None:
                value = getattr(getattr(config, name), effective[0])
                note = f" (unset: {effective[1]})"
            source = config.sources.get((name, key), DEFAULT_SOURCE)
            lines.append(f"{key} = {json.dumps(value, ensure_ascii=False)}  # from {source}{note}")
    return "\n".join(lines) + "\n"
