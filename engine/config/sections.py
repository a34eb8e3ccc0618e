"""The declared configuration: each section's keys, their types, defaults and checks.

One dataclass per ``[section]`` of ``sluice.toml``; a key's type hint drives its parsing,
its field metadata holds the per-key knowledge (a range check, a home-relative default,
the property that names its effective value while it is unset). ``SCHEMA`` lists every
section and key in declaration order, for the loader and the display.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import typing
from dataclasses import dataclass, field
from pathlib import Path  # noqa: TC003 - typing.get_type_hints resolves the hints at import
from typing import TYPE_CHECKING, Any, Final

from cryptography.fernet import Fernet

from engine.config.urls import check_url

if TYPE_CHECKING:
    from collections.abc import Callable

    Check = Callable[[Any], Any]

HEALTH_CHECK_HEARTBEAT_FACTOR: Final = 2.1


def split_items(items: list[Any]) -> tuple[str, ...]:
    """The stripped, non-empty strings of a list (a TypeError if one item is no string)."""
    if not all(isinstance(item, str) for item in items):
        raise TypeError("not a list of strings")
    return tuple(item.strip() for item in items if item.strip())


def _require(ok: Callable[[Any], object], problem: str) -> Check:  # checks raise "must ..."
    def check(value: Any) -> Any:
        try:
            if ok(value):
                return value
        except ValueError as exc:
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


def _networks(value: tuple[str, ...]) -> tuple[str, ...]:
    for item in value:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError as exc:
            raise ValueError(f"{item!r} is not an IP address or CIDR network") from exc
    return value


_DATABASE_URL: Final = _require(check_url, "must be a URL like postgresql+psycopg://u:p@host/db")
_FERNET_KEYS: Final = _require(
    lambda value: all(Fernet(key) for key in split_items(value.split(","))),
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
    #: Whether a DAG the DAG processor sees for the first time is stored paused (a DAG's
    #: own ``is_paused_upon_creation`` wins). Airflow's default is True; Sluice's stays
    #: False, its behaviour before the key existed: a new DAG runs as soon as it parses.
    dags_are_paused_at_creation: bool = _key(False)


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
    #: the probe for new trigger rows besides the wake-ups (in-process nudges, PostgreSQL
    #: notifications, SQLite commits): only bounds what a lost wake-up costs
    new_trigger_poll_interval_sec: float = _key(1.0, _POSITIVE)
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
    #: the scheduler's poll while no run is running, and the executor's claim poll: work
    #: wakes them (in-process nudges, PostgreSQL notifications, SQLite commits), so this
    #: only bounds what a lost wake-up costs; an idle engine wakes this often, not 20x/s
    idle_poll_interval_sec: float = _key(1.0, _POSITIVE)
    dag_dir_list_interval: float = _key(30.0, _NOT_NEGATIVE)
    #: every DAG file is parsed again this often, changed or not (for what it reads at parse
    #: time); changed files are parsed at once. Airflow: 30 s, its only way to see a change
    min_file_process_interval: float = _key(300.0, _NOT_NEGATIVE)
    health_check_threshold: float | None = _key(
        None, _POSITIVE, effective=("health_check_threshold_s", "2.1 x scheduler_heartbeat_sec")
    )
    keep_events_while_paused: bool = _key(True)
    #: the executor advances a task's run in the transaction that records the task's end
    #: (Airflow's "mini scheduler"): the next task of a chain is ready at once, not at the
    #: scheduler's next loop
    schedule_after_task_execution: bool = _key(True)
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
    #: The reverse proxies whose X-Forwarded-For / Forwarded headers name the client (IP
    #: addresses or CIDR networks); from any other peer those headers are ignored. None by
    #: default: the client is the TCP peer (``engine.api.proxies``).
    trusted_proxies: tuple[str, ...] = _key((), _networks)
    #: The largest request head (request line and headers) accepted: a longer request line
    #: is refused with 414, larger headers with 431.
    max_request_head_bytes: int = _key(65_536, _require(lambda v: v >= 4096, "must be >= 4096"))
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


@dataclass(frozen=True, slots=True, kw_only=True)
class StateStoreConfig:
    """The task and asset state stores (Airflow 3.3's ``[state_store]``)."""

    #: Days a task state store entry written without a retention of its own is kept before
    #: ``sluice db clean`` may delete it; 0: such entries never expire. Asset state store
    #: entries never expire.
    default_retention_days: int = _key(30, _NOT_NEGATIVE)


SECTIONS: Final[dict[str, type[Any]]] = {
    "core": CoreConfig,
    "triggerer": TriggererConfig,
    "scheduler": SchedulerConfig,
    "operators": OperatorsConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
    "api": ApiConfig,
    "executor": ExecutorConfig,
    "celery": CeleryConfig,
    "state_store": StateStoreConfig,
}
# section -> key -> (field, resolved type hint), in declaration order.
SCHEMA: Final[dict[str, dict[str, tuple[dataclasses.Field[Any], Any]]]] = {
    name: {f.name: (f, typing.get_type_hints(cls)[f.name]) for f in dataclasses.fields(cls)}
    for name, cls in SECTIONS.items()
}
