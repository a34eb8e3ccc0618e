"""``conf``: the engine's configuration as Airflow's ``airflow.sdk.conf`` reads it.

::

    from engine import conf

    conf.get("core", "dags_folder")                 # "/home/me/.sluice/dags"
    conf.getint("core", "parallelism")              # 8
    conf.getboolean("operators", "default_deferrable")
    conf.get("core", "no_such_key", fallback="x")   # "x"

The values are Sluice's effective configuration (defaults < ``sluice.toml`` <
``SLUICE__<SECTION>__<KEY>``, ``sluice config show``), loaded on first use in the process that
reads it. Secrets (the Fernet key, passwords in URLs) read redacted: a DAG file or a task
never needs them. An unknown section or key without ``fallback`` raises ``ConfigError``
naming it.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from engine.exceptions import ConfigError

_NOTSET: Final = object()
_TRUE: Final = frozenset({"true", "t", "1", "yes", "y", "on"})
_FALSE: Final = frozenset({"false", "f", "0", "no", "n", "off"})


class SdkConfig:
    """Read-only access to the effective configuration, section by section."""

    def __init__(self) -> None:
        self._values: dict[str, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<SdkConfig loaded={self._values is not None}>"

    def _sections(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            if self._values is None:
                # here, not at import: the configuration's URL checks import SQLAlchemy, which
                # a task process does not load unless a task reads conf
                from engine.config import load_config

                self._values = load_config().as_dict(redact=True)
            return self._values

    def reload(self) -> None:
        """Read the configuration again on the next access."""
        with self._lock:
            self._values = None

    def has_option(self, section: str, key: str) -> bool:
        return key.lower() in self._sections().get(section.lower(), {})

    def getsection(self, section: str) -> dict[str, Any] | None:
        """Key -> value of one section (None for an unknown section)."""
        values = self._sections().get(section.lower())
        return None if values is None else dict(values)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dict(values) for name, values in self._sections().items()}

    def _value(self, section: str, key: str, fallback: Any) -> Any:
        values = self._sections().get(section.lower())
        if values is None or key.lower() not in values:
            if fallback is not _NOTSET:
                return fallback
            known = sorted(self._sections()) if values is None else sorted(values)
            what = f"section [{section}]" if values is None else f"key {key!r} in [{section}]"
            raise ConfigError(f"conf: no {what}; known: {known}")
        return values[key.lower()]

    def get(self, section: str, key: str, fallback: Any = _NOTSET) -> Any:
        """The value as text (Airflow's ``conf.get``); None for an unset optional key."""
        value = self._value(section, key, fallback)
        if value is None or isinstance(value, str) or value is fallback:
            return value
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, list):
            return ",".join(str(item) for item in value)
        return str(value)

    def getboolean(self, section: str, key: str, fallback: Any = _NOTSET) -> bool:
        value = self._value(section, key, fallback)
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ConfigError(f"conf: [{section}] {key} = {value!r} is not a boolean")

    def getint(self, section: str, key: str, fallback: Any = _NOTSET) -> int:
        value = self._value(section, key, fallback)
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"conf: [{section}] {key} = {value!r} is not an int") from exc

    def getfloat(self, section: str, key: str, fallback: Any = _NOTSET) -> float:
        value = self._value(section, key, fallback)
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"conf: [{section}] {key} = {value!r} is not a number") from exc


#: the process's configuration, loaded when first read
conf: Final = SdkConfig()
