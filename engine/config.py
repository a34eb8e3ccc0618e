"""Configuration: typed defaults < ``$SLUICE_HOME/sluice.toml`` < ``SLUICE__<SECTION>__<KEY>``.

One generic path parses every key, driven by the section dataclasses' fields and type hints;
per-key knowledge (range checks, home-relative defaults) lives in field metadata. Only this
module reads the environment: components take explicit arguments built from a ``Config``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import logging
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cryptography.fernet import Fernet
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from engine.exceptions import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Check = Callable[[Any], Any]
    _Key = tuple[str, str]  # (section, key)

logger = logging.getLogger(__name__)

ENV_PREFIX: Final = "SLUICE__"
HOME_ENV_VAR: Final = "SLUICE_HOME"
CONFIG_ENV_VAR: Final = "SLUICE_CONFIG"
CONFIG_FILE_NAME: Final = "sluice.toml"
DEFAULT_HOME: Final = "~/.sluice"
DEFAULT_SOURCE: Final = "default"
HEALTH_CHECK_HEARTBEAT_FACTOR: Final = 2.1
REDACTED: Final = "***"


def _require(ok: Callable[[Any], object], problem: str) -> Check:  # checks raise "must ..."
    def check(value: Any) -> Any:
        try:
            if ok(value):
                return value
        except (ValueError, ArgumentError) as exc:
            raise ValueError(problem) from exc
        raise ValueError(problem)

    return check


def _one_of(*choices: str) -> Check:
    def check(value: str) -> str:
        for choice in (c for c in choices if c.casefold() == value.casefold()):
            return choice
        raise ValueError(f"must be one of {', '.join(choices)} (case-insensitive)")

    return check


_POSITIVE: Final = _require(lambda value: value > 0, "must be > 0")
_AT_LEAST_ONE: Final = _require(lambda value: value >= 1, "must be >= 1")
_NOT_NEGATIVE: Final = _require(lambda value: value >= 0, "must be >= 0")
_PORT: Final = _require(lambda value: 0 <= value <= 65535, "must be a port number, 0 to 65535")
_DATABASE_URL: Final = _require(make_url, "must be a URL like postgresql+psycopg://u:p@host/db")
_FERNET_KEYS: Final = _require(
    lambda value: all(Fernet(key) for key in _items(value.split(","))),
    "must be empty or comma-separated keys made by Fernet.generate_key()",
)


def _meta(check: Check | None = None, **extra: Any) -> dict[str, Any]:
    """``derive(home, earlier keys of the section)`` computes a home-relative default;
    ``effective`` = (property, explanation) names the value in use while the key is None."""
    return {"check": check, "derive": None, "effective": None, **extra}


def _key(default: Any, check: Check | None = None, *, secret: bool = False, **extra: Any) -> Any:
    return field(default=default, metadata=_meta(check, **extra), repr=not secret)


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreConfig:
    dags_folder: Path = field(metadata=_meta(derive=lambda home, _: home / "dags"))
    sql_alchemy_conn: str = field(
        repr=False, metadata=_meta(_DATABASE_URL, derive=lambda h, _: f"sqlite:///{h}/sluice.db")
    )
    fernet_key: str = _key("", _FERNET_KEYS, secret=True)
    parallelism: int = _key(8, _AT_LEAST_ONE)
    plugins_folder: Path = field(
        metadata=_meta(derive=lambda _, keys: keys["dags_folder"].parent / "plugins")
    )
    dag_file_processor_timeout: float = _key(30.0, _POSITIVE)
    max_asset_event_payload_bytes: int = _key(1_048_576, _AT_LEAST_ONE)
    #: The largest task result (one XCom value, as JSON) a task may store; a bigger one
    #: fails the task. Results live in the task instance row and travel to every later task
    #: of the run, so they are for small data (Airflow sets no limit of its own, only its
    #: database column does); 1 MiB, like an asset event's payload.
    max_xcom_size_bytes: int = _key(1_048_576, _AT_LEAST_ONE)
    #: How long ``sluice db clean`` keeps an asset event's dedup key, so that a redelivery of
    #: its broker message is still absorbed (14 days: SQS keeps a message at most 14 days).
    asset_event_dedup_retention_sec: float = _key(1_209_600.0, _NOT_NEGATIVE)


@dataclass(frozen=True, slots=True, kw_only=True)
class TriggererConfig:
    capacity: int = _key(1000, _AT_LEAST_ONE)
    job_heartbeat_sec: float = _key(5.0, _POSITIVE)
    triggerer_health_check_threshold: float | None = _key(
        None, _POSITIVE, effective=("health_check_threshold_s", "2.1 x job_heartbeat_sec")
    )
    shared_stream_ack_timeout: float = _key(300.0, _POSITIVE)
    shared_stream_subscriber_queue_size: int = _key(1024, _AT_LEAST_ONE)
    shared_stream_cohort_grace_period: float = _key(0.0, _NOT_NEGATIVE)
    blocked_main_thread_warning_threshold: float = _key(0.2, _POSITIVE)
    allowed_trigger_modules: tuple[str, ...] = _key(("triggers", "producers"))
    cleanup_interval_sec: float = _key(60.0, _POSITIVE)
    new_trigger_poll_interval_sec: float = _key(0.1, _POSITIVE)
    trigger_cleanup_timeout_sec: float = _key(10.0, _POSITIVE)
    shutdown_grace_period_sec: float = _key(30.0, _NOT_NEGATIVE)
    #: young-generation threshold of the garbage collector while a triggerer runs
    #: (``engine.triggerer.collector``); 0 leaves the interpreter's own settings
    gc_young_threshold: int = _key(50_000, _NOT_NEGATIVE)

    @property
    def health_check_threshold_s(self) -> float:
        """Heartbeat age after which a triggerer is dead and its triggers are taken over."""
        if self.triggerer_health_check_threshold is not None:
            return self.triggerer_health_check_threshold
        return HEALTH_CHECK_HEARTBEAT_FACTOR * self.job_heartbeat_sec


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    scheduler_heartbeat_sec: float = _key(5.0, _POSITIVE)
    loop_interval_sec: float = _key(0.05, _POSITIVE)
    dag_dir_list_interval: float = _key(30.0, _NOT_NEGATIVE)
    min_file_process_interval: float = _key(30.0, _NOT_NEGATIVE)
    health_check_threshold: float | None = _key(
        None, _POSITIVE, effective=("health_check_threshold_s", "2.1 x scheduler_heartbeat_sec")
    )
    keep_events_while_paused: bool = _key(True)
    #: a *running* try whose executor has not heartbeaten for this long is failed (retried
    #: per its retries; Airflow's default, 300 s): a queued one is requeued after
    #: ``health_check_threshold`` already, a running one only once its executor is surely gone
    task_instance_heartbeat_timeout: float = _key(300.0, _POSITIVE)

    @property
    def health_check_threshold_s(self) -> float:
        """Heartbeat age after which the scheduler is considered unhealthy."""
        if self.health_check_threshold is not None:
            return self.health_check_threshold
        return HEALTH_CHECK_HEARTBEAT_FACTOR * self.scheduler_heartbeat_sec


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorsConfig:
    default_deferrable: bool = _key(False)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    enabled: bool = _key(False)
    host: str = _key("127.0.0.1")
    port: int = _key(9464, _PORT)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingConfig:
    level: str = _key("INFO", _one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    format: str = _key("text", _one_of("text", "json"))
    task_log_folder: Path = field(metadata=_meta(derive=lambda home, _: home / "logs"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiConfig:
    """The REST API and web UI part (``sluice api-server``, and ``sluice run``)."""

    #: Loopback unless the operator opens it: the API mutates the engine.
    host: str = _key("127.0.0.1")
    port: int = _key(8793, _PORT)
    #: Reading (GET) without logging in; mutations always need a user or a token.
    open_read: bool = _key(False)
    #: Mark the session cookie ``Secure`` (set it when a TLS proxy fronts the API).
    cookie_secure: bool = _key(False)
    #: The largest request body accepted; a bigger one is refused with 413.
    max_body_bytes: int = _key(1_048_576, _AT_LEAST_ONE)
    #: How long a UI login lasts.
    session_hours: float = _key(12.0, _POSITIVE)
    #: The lifetime of a token made by ``sluice tokens create`` without ``--expires-in``
    #: (at most 3650 days, like ``--expires-in``).
    token_expiry_days: float = _key(
        90.0, _require(lambda value: 0 < value <= 3650, "must be > 0 and <= 3650 (10 years)")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorConfig:
    """Where task tries run, and how the local executor starts task steps: ``local`` child
    processes of ``sluice run`` / ``sluice executor``, or ``celery`` workers (``sluice celery
    worker``, which start their tries the same way) fed through a broker."""

    kind: str = _key("local", _one_of("local", "celery"))
    #: Fork each step from a pre-imported warm runner (a few milliseconds) rather than start a
    #: fresh interpreter (~100 ms); the same isolation either way (``engine.executor``).
    warm_runner: bool = _key(True)
    #: And import ahead in the warm runner the installed packages the DAG files import. Off:
    #: a package seeded at import (numpy's global random state, say) would give every step
    #: the same state, where fresh interpreters each get their own.
    warm_runner_dag_imports: bool = _key(False)


@dataclass(frozen=True, slots=True, kw_only=True)
class CeleryConfig:
    """The Celery executor (``[executor] kind = "celery"``): the broker tries are sent
    through, and the workers' defaults. Task state lives in the metadata DB either way."""

    #: ``redis://host:6379/0`` or ``amqp://user:password@host:5672/vhost``
    broker_url: str = _key("redis://127.0.0.1:6379/0", secret=True)
    #: Celery's result backend; empty (the default): none, the metadata DB holds the
    #: outcome of every try and nothing reads Celery's results
    result_backend: str = _key("", secret=True)
    #: task tries one ``sluice celery worker`` runs at a time (``--concurrency``)
    worker_concurrency: int = _key(8, _AT_LEAST_ONE)
    #: the queue of a task whose operator names none (``queue=``)
    default_queue: str = _key("default", _require(bool, "must not be empty"))
    #: a try ``queued`` this long without a worker starting it is sent again (a message
    #: lost with a broker that keeps nothing on disk, say); Airflow's task_queued_timeout
    task_queued_timeout: float = _key(600.0, _POSITIVE)
    #: Redis only: how long a delivered, unacknowledged message stays invisible before the
    #: broker hands it out again. Above the longest task; a redelivery of a try that is
    #: still running is recognised in the metadata DB and dropped anyway.
    visibility_timeout: float = _key(86_400.0, _POSITIVE)


_SECTIONS: Final[dict[str, type[Any]]] = {
    "core": CoreConfig,
    "triggerer": TriggererConfig,
    "scheduler": SchedulerConfig,
    "operators": OperatorsConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
    "api": ApiConfig,
    "executor": ExecutorConfig,
    "celery": CeleryConfig,
}
# section -> key -> (field, resolved type hint), in declaration order.
_SCHEMA: Final[dict[str, dict[str, tuple[dataclasses.Field[Any], Any]]]] = {
    name: {f.name: (f, typing.get_type_hints(cls)[f.name]) for f in dataclasses.fields(cls)}
    for name, cls in _SECTIONS.items()
}


def _redact_url(value: str) -> str:
    try:
        url = make_url(value)
    except ArgumentError:
        return REDACTED
    hidden = {name: REDACTED for name in url.query if "password" in name.lower()}
    return url.update_query_dict(hidden).render_as_string(hide_password=True)


_REDACTORS: Final[dict[_Key, Callable[[str], str]]] = {
    ("core", "fernet_key"): lambda value: REDACTED if value else "",
    ("core", "sql_alchemy_conn"): _redact_url,
    ("celery", "broker_url"): lambda value: _redact_url(value) if value else "",
    ("celery", "result_backend"): lambda value: _redact_url(value) if value else "",
}
SECRET_KEYS: Final[frozenset[tuple[str, str]]] = frozenset(_REDACTORS)


def _url_secrets(text: str) -> list[str]:
    """The password of a URL and its ``?password=`` style parameters (psycopg's, say)."""
    if not text:
        return []
    try:
        url = make_url(text)
    except ArgumentError:
        return []
    values = [str(url.password)] if url.password else []
    for name, value in url.query.items():
        if "password" in name.lower():
            values += [value] if isinstance(value, str) else list(value)
    return values


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

    def secret_values(self) -> list[str]:
        """Values that must never reach a log line: the Fernet keys (configured, or in the
        home's key file), the database password."""
        from engine.crypto import FERNET_KEY_FILENAME

        values = list(_items(self.core.fernet_key.split(",")))
        key_file = self.home / FERNET_KEY_FILENAME
        if not values and key_file.is_file():
            with contextlib.suppress(OSError, UnicodeError):
                values += _items(key_file.read_text().split(","))
        for text in (
            self.core.sql_alchemy_conn,
            self.celery.broker_url,
            self.celery.result_backend,
        ):
            values += _url_secrets(text)
        return values

    def as_dict(self, *, redact: bool = True) -> dict[str, dict[str, Any]]:
        """Section -> key -> value, JSON-friendly; an unset optional key is None."""
        result: dict[str, dict[str, Any]] = {name: {} for name in _SCHEMA}
        for name, schema in _SCHEMA.items():
            for key in schema:
                value = getattr(getattr(self, name), key)
                if redact and (name, key) in _REDACTORS:
                    value = _REDACTORS[(name, key)](value)
                is_path, is_tuple = isinstance(value, Path), isinstance(value, tuple)
                result[name][key] = str(value) if is_path else list(value) if is_tuple else value
        return result


@dataclass(frozen=True, slots=True)
class _Setting:
    value: object  # a TOML value, or the env var's string
    source: str  # the file path, or "env <VAR>"
    base_dir: Path  # what a relative path is resolved against
    from_env: bool


def _check_known(section: str, key: str | None, source: str) -> None:
    if section not in _SCHEMA:
        known = ", ".join(_SCHEMA)
        raise ConfigError(f"Unknown config section [{section}] (from {source}); known: {known}")
    if key is not None and key not in _SCHEMA[section]:
        close = difflib.get_close_matches(key, _SCHEMA[section], n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(_SCHEMA[section])}"
        raise ConfigError(f"Unknown config key {section}.{key} (from {source}); {hint}")


def _read_file(path: Path) -> dict[_Key, _Setting]:
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # names the line and column
        raise ConfigError(f"Config file {path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"Config file {path} cannot be read: {exc.strerror}") from exc
    settings = {}
    for section, table in document.items():
        _check_known(section, None, str(path))
        if not isinstance(table, dict):
            raise ConfigError(f"Config file {path}: {section!r} must be a [{section}] table")
        for key, value in table.items():
            _check_known(section, key, str(path))
            settings[(section, key)] = _Setting(value, str(path), path.parent, from_env=False)
    return settings


def _read_env(environ: Mapping[str, str], cwd: Path) -> dict[_Key, _Setting]:
    settings: dict[_Key, _Setting] = {}
    for name in sorted(environ):
        if name[: len(ENV_PREFIX)].upper() != ENV_PREFIX:
            continue
        parts, source = name[len(ENV_PREFIX) :].lower().split("__"), f"env {name}"
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"Environment variable {name} is not SLUICE__<SECTION>__<KEY>")
        section, key = parts
        _check_known(section, key, source)
        if (section, key) in settings:
            other = settings[(section, key)].source
            raise ConfigError(f"Config key {section}.{key} set by {source} and {other}: unset one")
        settings[(section, key)] = _Setting(environ[name], source, cwd, from_env=True)
    return settings


# Coercion: an env string is parsed first, then both sources take the same typed path.
_ENV_TRUE: Final = ("true", "1", "yes", "on")
_ENV_BOOLS: Final = {word: word in _ENV_TRUE for word in (*_ENV_TRUE, "false", "0", "no", "off")}


def _items(items: list[Any]) -> tuple[str, ...]:
    if not all(isinstance(item, str) for item in items):
        raise TypeError("not a list of strings")
    return tuple(item.strip() for item in items if item.strip())


def _absolute(path: Path, base_dir: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else base_dir / path


# base type -> (TOML value types accepted, parser of an env string, what is expected)
_KINDS: Final[dict[Any, tuple[Any, Callable[[str], Any], str]]] = {
    int: ((int,), int, "an integer"),
    float: ((int, float), float, "a number"),
    bool: ((bool,), lambda raw: _ENV_BOOLS[raw.strip().lower()], "true or false"),
    str: ((str,), str, "a string"),
    Path: ((str,), str, "a path"),
    tuple: ((list,), lambda raw: raw.split(","), "a list of strings (env: comma-separated)"),
}


def _typed(base: Any, setting: _Setting) -> Any:
    accepted, parse, _ = _KINDS[base]
    value: Any = parse(str(setting.value)) if setting.from_env else setting.value
    if not isinstance(value, accepted) or (isinstance(value, bool) and base is not bool):
        raise TypeError(f"{type(value).__name__} is not {base}")
    if base is Path and not value.strip():
        raise ValueError("empty path")
    if base is Path:
        return _absolute(Path(value), setting.base_dir)
    return _items(value) if base is tuple else float(value) if base is float else value


def _convert(section: str, key: str, setting: _Setting) -> Any:
    """The typed, checked value of one setting (a str from env, a TOML value from the file)."""
    fld, hint = _SCHEMA[section][key]
    optional = type(None) in typing.get_args(hint)  # `X | None`: the only unions used
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    raw, from_env = setting.value, setting.from_env
    if optional and from_env and str(raw).strip().lower() in {"", "none"}:
        return None
    got = "" if (section, key) in _REDACTORS else f", got {type(raw).__name__} {raw!r}"
    where = f"Config key {section}.{key} (from {setting.source})"
    try:
        value = _typed(typing.get_origin(base) or base, setting)
    except (TypeError, ValueError, KeyError) as exc:
        expected = _KINDS[typing.get_origin(base) or base][2]
        problem = f"must be {expected}{' or none' if optional and from_env else ''}{got}"
        raise ConfigError(f"{where} {problem}") from exc
    try:
        return value if fld.metadata["check"] is None else fld.metadata["check"](value)
    except ValueError as exc:
        raise ConfigError(f"{where} {exc}{got}") from exc


def _build_section(
    name: str, settings: Mapping[_Key, _Setting], home: Path, sources: dict[_Key, str]
) -> Any:
    """The section's dataclass; records each key's source in ``sources``."""
    values: dict[str, Any] = {}
    for key, (fld, _) in _SCHEMA[name].items():
        setting = settings.get((name, key))
        if setting is None:
            derive = fld.metadata["derive"]
            values[key] = derive(home, values) if derive else fld.default
        else:
            values[key] = _convert(name, key, setting)
        sources[(name, key)] = DEFAULT_SOURCE if setting is None else setting.source
    return _SECTIONS[name](**values)


def sluice_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$SLUICE_HOME`` (relative to the cwd if relative), else ``~/.sluice``."""
    env = os.environ if environ is None else environ
    return _absolute(Path(env.get(HOME_ENV_VAR, "").strip() or DEFAULT_HOME), Path.cwd())


def load_config(
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    config_file: Path | None = None,
) -> Config:
    """Defaults < the file (``config_file``, else ``$SLUICE_CONFIG``, else
    ``<home>/sluice.toml``, which may be missing) < env. ``ConfigError`` names the key and
    source. A file named explicitly (argument or ``$SLUICE_CONFIG``) must exist: a typo there
    must not silently run on defaults."""
    env = os.environ if environ is None else environ
    cwd = Path.cwd()
    home_dir = _absolute(home, cwd) if home is not None else sluice_home(env)
    named_by = "the config_file argument" if config_file is not None else None
    if config_file is None and env.get(CONFIG_ENV_VAR, "").strip():
        named_by = CONFIG_ENV_VAR
    if config_file is None:
        from_env = env.get(CONFIG_ENV_VAR, "").strip()
        config_file = Path(from_env) if from_env else home_dir / CONFIG_FILE_NAME
    config_file = _absolute(config_file, cwd)
    if named_by is not None and not config_file.is_file():
        raise ConfigError(
            f"config file {config_file} (named by {named_by}) does not exist; fix the path or "
            f"unset {CONFIG_ENV_VAR} to use {home_dir / CONFIG_FILE_NAME}"
        )
    settings = {**_read_file(config_file), **_read_env(env, cwd)}
    sources: dict[_Key, str] = {}
    sections = {name: _build_section(name, settings, home_dir, sources) for name in _SCHEMA}
    logger.debug("Config loaded from %s", config_file, extra={"action": "config_loaded"})
    proxy = types.MappingProxyType(sources)
    return Config(home=home_dir, config_file=config_file, sources=proxy, **sections)


def render_config(config: Config) -> str:
    """TOML-like text of the effective (redacted) config, each key with its source."""
    found = "" if config.config_file.is_file() else " (not found)"
    lines = [f"# Sluice home: {config.home}", f"# Config file: {config.config_file}{found}"]
    values = config.as_dict(redact=True)
    for name, schema in _SCHEMA.items():
        lines += ["", f"[{name}]"]
        for key, (fld, _) in schema.items():
            value, note = values[name][key], ""
            if value is None and (effective := fld.metadata["effective"]) is not None:
                value = getattr(getattr(config, name), effective[0])
                note = f" (unset: {effective[1]})"
            source = config.sources.get((name, key), DEFAULT_SOURCE)
            lines.append(f"{key} = {json.dumps(value, ensure_ascii=False)}  # from {source}{note}")
    return "\n".join(lines) + "\n"
