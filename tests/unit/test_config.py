"""The configuration layer: defaults < TOML file < SLUICE__SECTION__KEY env vars."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from engine.config import (
    SECRET_KEYS,
    Config,
    CoreConfig,
    ExecutorConfig,
    LoggingConfig,
    MetricsConfig,
    OperatorsConfig,
    SchedulerConfig,
    TriggererConfig,
    load_config,
    render_config,
    sluice_home,
)
from engine.exceptions import ConfigError
from engine.executor.settings import ExecutorSettings

NO_HOME = Path("/nonexistent-sluice-home")
FERNET_KEY = Fernet.generate_key().decode()
PG_PASSWORD = "s3cr3t-Pa55"
PG_URL = f"postgresql+psycopg://sluice:{PG_PASSWORD}@db.example:5432/sluice"


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sluice.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, toml: str | None = None, **env: str) -> Config:
    if toml is not None:
        write_toml(tmp_path, toml)
    return load_config(environ=env, home=tmp_path)


# --- defaults and layering


def test_defaults(tmp_path: Path) -> None:
    config = load_config(environ={}, home=tmp_path)
    assert config.home == tmp_path
    assert config.config_file == tmp_path / "sluice.toml"
    assert config.core.dags_folder == tmp_path / "dags"
    assert config.core.sql_alchemy_conn == f"sqlite:///{tmp_path}/sluice.db"
    assert config.core.sql_alchemy_conn.startswith("sqlite:////")  # absolute SQLite path
    assert config.core.fernet_key == ""
    assert config.core.parallelism == 8
    assert config.core.plugins_folder == tmp_path / "plugins"
    assert config.core.dag_file_processor_timeout == 30.0
    assert config.core.max_asset_event_payload_bytes == 1_048_576
    assert config.core.asset_event_dedup_retention_sec == 14 * 86_400
    assert config.triggerer == TriggererConfig()
    assert config.triggerer.capacity == 1000
    assert config.triggerer.job_heartbeat_sec == 5.0
    assert config.triggerer.allowed_trigger_modules == ("triggers", "producers")
    assert config.triggerer.shared_stream_ack_timeout == 300.0
    assert config.triggerer.shared_stream_subscriber_queue_size == 1024
    assert config.triggerer.trigger_cleanup_timeout_sec == 10.0
    assert config.scheduler == SchedulerConfig()
    assert config.scheduler.loop_interval_sec == 0.05
    assert config.scheduler.keep_events_while_paused is True
    assert config.operators == OperatorsConfig(default_deferrable=False)
    assert config.metrics == MetricsConfig(enabled=False, host="127.0.0.1", port=9464)
    assert (config.api.host, config.api.port, config.api.open_read) == ("127.0.0.1", 8793, False)
    assert config.logging == LoggingConfig(task_log_folder=tmp_path / "logs")
    assert config.logging.level == "INFO"
    assert config.logging.format == "text"
    assert config.executor == ExecutorConfig(warm_runner=True, warm_runner_dag_imports=False)
    assert set(config.sources.values()) == {"default"}


def test_every_key_has_a_source(tmp_path: Path) -> None:
    config = load_config(environ={}, home=tmp_path)
    expected = {
        (name, f.name)
        for name in (
            "core",
            "triggerer",
            "scheduler",
            "operators",
            "metrics",
            "logging",
            "api",
            "executor",
            "celery",
            "state_store",
        )
        for f in dataclasses.fields(getattr(config, name))
    }
    assert set(config.sources) == expected
    assert set(config.as_dict()) == {name for name, _ in expected}


def test_celery_settings_and_their_secrets(tmp_path: Path) -> None:
    config = load_config(environ={}, home=tmp_path)
    assert config.executor.kind == "local"
    assert config.celery.default_queue == "default"
    assert config.celery.result_backend == ""
    config = load_config(
        environ={
            "SLUICE__EXECUTOR__KIND": "celery",
            "SLUICE__CELERY__BROKER_URL": "amqp://guest:s3cret@127.0.0.1:5672/vh",
            "SLUICE__CELERY__RESULT_BACKEND": "redis://:b4ckend@127.0.0.1:6379/1",
            "SLUICE__CELERY__WORKER_CONCURRENCY": "3",
        },
        home=tmp_path,
    )
    assert (config.executor.kind, config.celery.worker_concurrency) == ("celery", 3)
    assert {"s3cret", "b4ckend"} <= set(config.secret_values())
    shown = config.as_dict()["celery"]
    assert "s3cret" not in shown["broker_url"] and "b4ckend" not in shown["result_backend"]
    assert shown["broker_url"].startswith("amqp://guest:")
    with pytest.raises(ConfigError, match="kind"):
        load_config(environ={"SLUICE__EXECUTOR__KIND": "kubernetes"}, home=tmp_path)


def test_sluice_home_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sluice_home({}) == Path("~/.sluice").expanduser()
    assert sluice_home({"SLUICE_HOME": str(tmp_path)}) == tmp_path
    monkeypatch.chdir(tmp_path)
    assert sluice_home({"SLUICE_HOME": "relative/home"}) == tmp_path / "relative" / "home"
    config = load_config(environ={"SLUICE_HOME": str(tmp_path / "h")})
    assert config.home == tmp_path / "h"
    assert config.core.dags_folder == tmp_path / "h" / "dags"


def test_the_home_says_where_it_came_from(tmp_path: Path) -> None:
    """A command that finds no database names the home it used and why that one."""
    assert load_config(environ={"SLUICE_HOME": str(tmp_path)}).home_source == "env SLUICE_HOME"
    assert load_config(environ={}).home_source == "the default: SLUICE_HOME is unset"
    assert load_config(environ={}, home=tmp_path).home_source == "the home argument"


def test_sluice_config_env_and_argument_choose_the_file(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text("[core]\nparallelism = 3\n", encoding="utf-8")
    write_toml(tmp_path, "[core]\nparallelism = 2\n")
    by_env = load_config(environ={"SLUICE_CONFIG": str(elsewhere)}, home=tmp_path)
    assert (by_env.config_file, by_env.core.parallelism) == (elsewhere, 3)
    by_arg = load_config(
        environ={"SLUICE_CONFIG": str(elsewhere)},
        home=tmp_path,
        config_file=tmp_path / "sluice.toml",
    )
    assert by_arg.core.parallelism == 2


def test_file_over_default(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
        [core]
        parallelism = 4
        [triggerer]
        capacity = 50
        job_heartbeat_sec = 2
        [metrics]
        enabled = true
        """,
    )
    config = load_config(environ={}, home=tmp_path)
    assert config.core.parallelism == 4
    assert config.triggerer.capacity == 50
    assert config.triggerer.job_heartbeat_sec == 2.0
    assert isinstance(config.triggerer.job_heartbeat_sec, float)  # int accepted for a float
    assert config.metrics.enabled is True
    assert config.sources[("triggerer", "capacity")] == str(path)
    assert config.sources[("triggerer", "shared_stream_ack_timeout")] == "default"


def test_env_over_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[triggerer]\ncapacity = 50\nshared_stream_ack_timeout = 9\n")
    config = load_config(environ={"SLUICE__TRIGGERER__CAPACITY": "7"}, home=tmp_path)
    assert config.triggerer.capacity == 7
    assert config.triggerer.shared_stream_ack_timeout == 9.0
    assert config.sources[("triggerer", "capacity")] == "env SLUICE__TRIGGERER__CAPACITY"
    assert config.sources[("triggerer", "shared_stream_ack_timeout")] == str(path)


@pytest.mark.parametrize(
    "name",
    ["SLUICE__TRIGGERER__CAPACITY", "SLUICE__triggerer__capacity", "sluice__Triggerer__CaPaCiTy"],
)
def test_env_var_section_and_key_are_case_insensitive(tmp_path: Path, name: str) -> None:
    config = load(tmp_path, **{name: "12"})
    assert config.triggerer.capacity == 12
    assert config.sources[("triggerer", "capacity")] == f"env {name}"


def test_env_var_set_twice_in_different_case_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"triggerer\.capacity") as info:
        load(tmp_path, SLUICE__TRIGGERER__CAPACITY="1", SLUICE__triggerer__capacity="2")
    assert "SLUICE__TRIGGERER__CAPACITY" in str(info.value)
    assert "SLUICE__triggerer__capacity" in str(info.value)


def test_unrelated_env_vars_are_ignored(tmp_path: Path) -> None:
    config = load(tmp_path, PATH="/bin", SLUICE_FOO="x", AIRFLOW__CORE__PARALLELISM="3")
    assert config.core.parallelism == 8


@pytest.mark.parametrize("name", ["SLUICE__CORE", "SLUICE__CORE__DAGS__X", "SLUICE____X"])
def test_malformed_env_var_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load(tmp_path, **{name: "1"})


# --- coercion from env strings


@pytest.mark.parametrize(
    ("name", "raw", "section", "key", "expected"),
    [
        ("SLUICE__CORE__PARALLELISM", " 16 ", "core", "parallelism", 16),
        ("SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC", "2.5", "triggerer", "job_heartbeat_sec", 2.5),
        ("SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC", "3", "triggerer", "job_heartbeat_sec", 3.0),
        ("SLUICE__METRICS__HOST", "0.0.0.0", "metrics", "host", "0.0.0.0"),
        ("SLUICE__LOGGING__LEVEL", "debug", "logging", "level", "DEBUG"),
        ("SLUICE__LOGGING__FORMAT", "JSON", "logging", "format", "json"),
        (
            "SLUICE__SCHEDULER__HEALTH_CHECK_THRESHOLD",
            "",
            "scheduler",
            "health_check_threshold",
            None,
        ),
        (
            "SLUICE__SCHEDULER__HEALTH_CHECK_THRESHOLD",
            "None",
            "scheduler",
            "health_check_threshold",
            None,
        ),
        (
            "SLUICE__SCHEDULER__HEALTH_CHECK_THRESHOLD",
            "7",
            "scheduler",
            "health_check_threshold",
            7.0,
        ),
    ],
)
def test_env_coercion(
    tmp_path: Path, name: str, raw: str, section: str, key: str, expected: object
) -> None:
    value = getattr(getattr(load(tmp_path, **{name: raw}), section), key)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("On", True), (" yes ", True),
        ("false", False), ("False", False), ("0", False), ("no", False), ("OFF", False),
    ],
)  # fmt: skip
def test_env_bool(tmp_path: Path, raw: str, expected: bool) -> None:
    assert (
        load(tmp_path, SLUICE__OPERATORS__DEFAULT_DEFERRABLE=raw).operators.default_deferrable
        is expected
    )


def test_the_executor_section_sets_the_warm_runner(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text("[executor]\nwarm_runner = false\n")
    config = load(tmp_path, SLUICE__EXECUTOR__WARM_RUNNER_DAG_IMPORTS="true")
    settings = ExecutorSettings.from_config(config)
    assert (settings.warm_runner, settings.warm_runner_dag_imports) == (False, True)
    with pytest.raises(ConfigError, match=r"executor.warm_runner .* must be true or false"):
        load(tmp_path, SLUICE__EXECUTOR__WARM_RUNNER="sometimes")


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("SLUICE__OPERATORS__DEFAULT_DEFERRABLE", "maybe"),
        ("SLUICE__OPERATORS__DEFAULT_DEFERRABLE", ""),
        ("SLUICE__OPERATORS__DEFAULT_DEFERRABLE", "2"),
        ("SLUICE__CORE__PARALLELISM", "eight"),
        ("SLUICE__CORE__PARALLELISM", "1.5"),
        ("SLUICE__CORE__PARALLELISM", ""),
        ("SLUICE__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT", "5s"),
        ("SLUICE__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT", "none"),  # not optional
        ("SLUICE__SCHEDULER__HEALTH_CHECK_THRESHOLD", "soon"),
        ("SLUICE__CORE__DAGS_FOLDER", "  "),
    ],
)
def test_env_bad_value_names_key_and_var(tmp_path: Path, name: str, raw: str) -> None:
    section, key = name.lower().split("__")[1:]
    with pytest.raises(ConfigError) as info:
        load(tmp_path, **{name: raw})
    message = str(info.value)
    assert f"{section}.{key}" in message
    assert f"env {name}" in message
    assert repr(raw) in message


def test_env_path_expands_user_and_resolves_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load(
        tmp_path / "home",
        SLUICE__CORE__DAGS_FOLDER="my/dags",
        SLUICE__LOGGING__TASK_LOG_FOLDER="~/sluice-logs",
    )
    assert config.core.dags_folder == tmp_path / "my" / "dags"
    assert config.core.plugins_folder == tmp_path / "my" / "plugins"
    assert config.logging.task_log_folder == Path.home() / "sluice-logs"


def test_allowed_trigger_modules_from_env(tmp_path: Path) -> None:
    config = load(tmp_path, SLUICE__TRIGGERER__ALLOWED_TRIGGER_MODULES=" triggers , my.pkg,, ,x ")
    assert config.triggerer.allowed_trigger_modules == ("triggers", "my.pkg", "x")
    empty = load(tmp_path, SLUICE__TRIGGERER__ALLOWED_TRIGGER_MODULES="")
    assert empty.triggerer.allowed_trigger_modules == ()


# --- the TOML file


def test_allowed_trigger_modules_from_toml(tmp_path: Path) -> None:
    config = load(
        tmp_path, '[triggerer]\nallowed_trigger_modules = ["triggers", " acme.triggers ", ""]\n'
    )
    assert config.triggerer.allowed_trigger_modules == ("triggers", "acme.triggers")


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('parallelism = "8"', "core.parallelism"),  # a string for an int: the file is typed
        ("parallelism = 8.0", "core.parallelism"),
        ("parallelism = true", "core.parallelism"),  # a bool is not an int
        ("dag_file_processor_timeout = true", "core.dag_file_processor_timeout"),
        ('dag_file_processor_timeout = "30"', "core.dag_file_processor_timeout"),
        ("dags_folder = 3", "core.dags_folder"),
        ('dags_folder = ""', "core.dags_folder"),
        ("fernet_key = 3", "core.fernet_key"),
    ],
)
def test_wrong_type_in_toml_names_key_and_file(tmp_path: Path, line: str, key: str) -> None:
    path = write_toml(tmp_path, f"[core]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, home=tmp_path)
    assert key in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[operators]\ndefault_deferrable = "true"\n', "operators.default_deferrable"),
        ("[operators]\ndefault_deferrable = 1\n", "operators.default_deferrable"),
        (
            '[triggerer]\nallowed_trigger_modules = "triggers"\n',
            "triggerer.allowed_trigger_modules",
        ),
        ("[triggerer]\nallowed_trigger_modules = [1, 2]\n", "triggerer.allowed_trigger_modules"),
        ("[metrics]\nhost = 127\n", "metrics.host"),
    ],
)
def test_wrong_type_in_toml_other_kinds(tmp_path: Path, toml: str, key: str) -> None:
    path = write_toml(tmp_path, toml)
    with pytest.raises(ConfigError, match=key) as info:
        load_config(environ={}, home=tmp_path)
    assert str(path) in str(info.value)


def test_not_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[core]\nparallelism = 4\nthis is not toml\n")
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, home=tmp_path)
    assert str(path) in str(info.value)
    assert "line 3" in str(info.value)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "sluice.toml"
    path.write_bytes(b"[core]\nfernet_key = '\xff'\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(environ={}, home=tmp_path)
    assert str(path) in str(info.value)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").mkdir()
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(environ={}, home=tmp_path)


def test_missing_file_is_not_an_error(tmp_path: Path) -> None:
    config = load_config(environ={}, home=tmp_path / "does-not-exist")
    assert not config.config_file.exists()
    assert config.core.parallelism == 8


def test_relative_paths_in_file_resolve_against_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "sluice.toml").write_text(
        '[core]\ndags_folder = "../project/dags"\n[logging]\ntask_log_folder = "logs"\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)  # not the reference: the file's directory is
    config = load_config(environ={}, home=tmp_path / "home", config_file=conf_dir / "sluice.toml")
    assert config.core.dags_folder == conf_dir / "../project/dags"
    assert config.core.dags_folder.resolve() == (tmp_path / "project" / "dags").resolve()
    assert config.core.plugins_folder.resolve() == (tmp_path / "project" / "plugins").resolve()
    assert config.logging.task_log_folder == conf_dir / "logs"


def test_relative_config_file_resolves_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.toml").write_text("[core]\nparallelism = 5\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    config = load_config(environ={"SLUICE_CONFIG": "x.toml"}, home=tmp_path / "home")
    assert config.config_file == tmp_path / "x.toml"
    assert config.core.parallelism == 5


# --- unknown sections and keys


def test_unknown_section_in_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[webserver]\nport = 8080\n")
    with pytest.raises(ConfigError, match=r"\[webserver\]") as info:
        load_config(environ={}, home=tmp_path)
    assert str(path) in str(info.value)


def test_empty_unknown_section_in_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[nope\]"):
        load(tmp_path, "[nope]\n")


def test_top_level_key_in_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'core' must be a \\[core\\] table"):
        load(tmp_path, "core = 1\n")


def test_unknown_key_in_file_suggests_the_close_one(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[triggerer]\ncapacty = 5\n")
    with pytest.raises(ConfigError, match=r"triggerer\.capacty") as info:
        load_config(environ={}, home=tmp_path)
    assert str(path) in str(info.value)
    assert "did you mean 'capacity'" in str(info.value)


def test_unknown_section_in_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[webserver\].*env SLUICE__WEBSERVER__PORT"):
        load(tmp_path, SLUICE__WEBSERVER__PORT="1")


def test_unknown_key_in_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"core\.load_examples.*env SLUICE__CORE__LOAD_EXAMPLES"):
        load(tmp_path, SLUICE__CORE__LOAD_EXAMPLES="true")


# --- range checks


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("SLUICE__TRIGGERER__CAPACITY", "0"),
        ("SLUICE__CORE__PARALLELISM", "-1"),
        ("SLUICE__CORE__MAX_ASSET_EVENT_PAYLOAD_BYTES", "0"),
        ("SLUICE__CORE__ASSET_EVENT_DEDUP_RETENTION_SEC", "-1"),
        ("SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC", "0"),
        ("SLUICE__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT", "0"),
        ("SLUICE__TRIGGERER__SHARED_STREAM_SUBSCRIBER_QUEUE_SIZE", "0"),
        ("SLUICE__TRIGGERER__SHARED_STREAM_COHORT_GRACE_PERIOD", "-0.5"),
        ("SLUICE__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", "-1"),
        ("SLUICE__TRIGGERER__TRIGGER_CLEANUP_TIMEOUT_SEC", "0"),
        ("SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC", "-1"),
        ("SLUICE__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", "-5"),
        ("SLUICE__SCHEDULER__LOOP_INTERVAL_SEC", "0"),
        ("SLUICE__SCHEDULER__HEALTH_CHECK_THRESHOLD", "0"),
        ("SLUICE__METRICS__PORT", "-1"),
        ("SLUICE__METRICS__PORT", "65536"),
        ("SLUICE__LOGGING__LEVEL", "verbose"),
        ("SLUICE__LOGGING__FORMAT", "xml"),
        ("SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC", "nan"),
    ],
)
def test_out_of_range_names_key_and_source(tmp_path: Path, name: str, raw: str) -> None:
    section, key = name.lower().split("__")[1:]
    with pytest.raises(ConfigError, match=rf"{section}\.{key} \(from env {name}\) must") as info:
        load(tmp_path, **{name: raw})
    assert repr(raw) in str(info.value)


def test_out_of_range_in_file_names_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[metrics]\nport = 70000\n")
    with pytest.raises(ConfigError, match=r"metrics\.port") as info:
        load_config(environ={}, home=tmp_path)
    assert f"(from {path})" in str(info.value)


@pytest.mark.parametrize(
    ("name", "raw"), [("SLUICE__METRICS__PORT", "0"), ("SLUICE__METRICS__PORT", "65535")]
)
def test_range_bounds_are_inclusive(tmp_path: Path, name: str, raw: str) -> None:
    assert load(tmp_path, **{name: raw}).metrics.port == int(raw)


def test_zero_dedup_retention_is_allowed(tmp_path: Path) -> None:
    config = load(tmp_path, SLUICE__CORE__ASSET_EVENT_DEDUP_RETENTION_SEC="0")
    assert config.core.asset_event_dedup_retention_sec == 0.0


def test_zero_grace_periods_are_allowed(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        SLUICE__TRIGGERER__SHARED_STREAM_COHORT_GRACE_PERIOD="0",
        SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC="0",
        SLUICE__TRIGGERER__SHARED_STREAM_SUBSCRIBER_QUEUE_SIZE="1",
    )
    assert config.triggerer.shared_stream_cohort_grace_period == 0.0
    assert config.triggerer.shutdown_grace_period_sec == 0.0


def test_bad_database_url_is_rejected_without_echoing_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"core\.sql_alchemy_conn") as info:
        load(tmp_path, SLUICE__CORE__SQL_ALCHEMY_CONN=f"not a url {PG_PASSWORD}")
    assert PG_PASSWORD not in str(info.value)


def test_bad_fernet_key_is_rejected_without_echoing_it(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"core\.fernet_key \(from env SLUICE__CORE__FERNET_KEY\)"
    ) as info:
        load(tmp_path, SLUICE__CORE__FERNET_KEY="too-short-secret")
    assert "too-short-secret" not in str(info.value)


def test_several_fernet_keys_are_accepted(tmp_path: Path) -> None:
    keys = f"{FERNET_KEY},{Fernet.generate_key().decode()}"
    assert load(tmp_path, SLUICE__CORE__FERNET_KEY=keys).core.fernet_key == keys


# --- health check thresholds


def test_health_check_thresholds_derive_from_heartbeats(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC="2",
        SLUICE__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="10",
    )
    assert config.triggerer.triggerer_health_check_threshold is None
    assert config.triggerer.health_check_threshold_s == pytest.approx(4.2)
    assert config.scheduler.health_check_threshold is None
    assert config.scheduler.health_check_threshold_s == pytest.approx(21.0)
    assert load(tmp_path).triggerer.health_check_threshold_s == pytest.approx(10.5)


def test_health_check_thresholds_explicit_override(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "[triggerer]\ntriggerer_health_check_threshold = 30\n"
        "[scheduler]\nhealth_check_threshold = 7.5\n",
        SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC="2",
    )
    assert config.triggerer.health_check_threshold_s == 30.0
    assert config.scheduler.health_check_threshold_s == 7.5


# --- redaction and rendering


def secret_config(tmp_path: Path) -> Config:
    return load(
        tmp_path,
        f'[core]\nsql_alchemy_conn = "{PG_URL}?sslmode=require&sslpassword=other-{PG_PASSWORD}"\n',
        SLUICE__CORE__FERNET_KEY=FERNET_KEY,
    )


def test_secret_keys() -> None:
    assert ("core", "fernet_key") in SECRET_KEYS
    assert ("core", "sql_alchemy_conn") in SECRET_KEYS


def test_as_dict_redacts_secrets(tmp_path: Path) -> None:
    values = secret_config(tmp_path).as_dict()
    assert values["core"]["fernet_key"] == "***"
    conn = values["core"]["sql_alchemy_conn"]
    assert conn.startswith("postgresql+psycopg://sluice:***@db.example:5432/sluice")
    assert "sslmode=require" in conn
    dumped = json.dumps(values)  # JSON-friendly
    assert PG_PASSWORD not in dumped
    assert FERNET_KEY not in dumped


def test_as_dict_unredacted_and_json_friendly(tmp_path: Path) -> None:
    values = secret_config(tmp_path).as_dict(redact=False)
    assert values["core"]["fernet_key"] == FERNET_KEY
    assert values["core"]["sql_alchemy_conn"].startswith(PG_URL)
    assert values["core"]["dags_folder"] == str(tmp_path / "dags")
    assert values["triggerer"]["allowed_trigger_modules"] == ["triggers", "producers"]
    assert values["scheduler"]["health_check_threshold"] is None
    assert json.loads(json.dumps(values)) == values


def test_unset_fernet_key_is_shown_empty(tmp_path: Path) -> None:
    assert load(tmp_path).as_dict()["core"]["fernet_key"] == ""


def test_render_config_hides_secrets_and_names_sources(tmp_path: Path) -> None:
    config = secret_config(tmp_path)
    text = render_config(config)
    assert PG_PASSWORD not in text
    assert FERNET_KEY not in text
    assert 'fernet_key = "***"  # from env SLUICE__CORE__FERNET_KEY' in text
    assert f"# from {tmp_path / 'sluice.toml'}" in text
    assert "capacity = 1000  # from default" in text
    assert "[triggerer]" in text
    assert 'allowed_trigger_modules = ["triggers", "producers"]' in text
    assert "triggerer_health_check_threshold = 10.5  # from default (unset:" in text
    assert f"# Config file: {tmp_path / 'sluice.toml'}\n" in text


def test_render_config_says_when_the_file_is_missing(tmp_path: Path) -> None:
    assert "(not found)" in render_config(load(tmp_path))


def test_repr_never_shows_secrets(tmp_path: Path) -> None:
    config = secret_config(tmp_path)
    assert PG_PASSWORD not in repr(config)
    assert FERNET_KEY not in repr(config)
    assert PG_PASSWORD not in repr(config.core)


def test_config_is_immutable(tmp_path: Path) -> None:
    config = load(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.core.parallelism = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.sources[("core", "parallelism")] = "x"  # type: ignore[index]


def test_core_config_needs_its_home_relative_keys() -> None:
    with pytest.raises(TypeError):
        CoreConfig()  # type: ignore[call-arg]


# --- invariants


@given(
    file_value=st.integers(min_value=1, max_value=10**9) | st.none(),
    env_value=st.integers(min_value=1, max_value=10**9) | st.none(),
    spelling=st.sampled_from(["SLUICE__TRIGGERER__CAPACITY", "sluice__triggerer__capacity"]),
)
def test_env_beats_file_beats_default(
    tmp_path_factory: pytest.TempPathFactory,
    file_value: int | None,
    env_value: int | None,
    spelling: str,
) -> None:
    home = tmp_path_factory.mktemp("home")
    if file_value is not None:
        write_toml(home, f"[triggerer]\ncapacity = {file_value}\n")
    environ = {} if env_value is None else {spelling: f" {env_value} "}
    config = load_config(environ=environ, home=home)
    expected = next(v for v in (env_value, file_value, 1000) if v is not None)
    assert config.triggerer.capacity == expected
    source = config.sources[("triggerer", "capacity")]
    if env_value is not None:
        assert source == f"env {spelling}"
    elif file_value is not None:
        assert source == str(home / "sluice.toml")
    else:
        assert source == "default"


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=1e-6, max_value=1e9))
def test_float_env_values_round_trip(value: float) -> None:
    config = load_config(
        environ={"SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC": repr(value)}, home=NO_HOME
    )
    assert config.triggerer.job_heartbeat_sec == value
    assert config.triggerer.health_check_threshold_s == pytest.approx(2.1 * value)


def test_a_config_file_named_explicitly_must_exist(tmp_path) -> None:
    from engine.config import load_config
    from engine.exceptions import ConfigError

    missing = tmp_path / "typo.toml"
    env = {"SLUICE_HOME": str(tmp_path), "SLUICE_CONFIG": str(missing)}
    with pytest.raises(ConfigError, match="SLUICE_CONFIG"):
        load_config(environ=env)
    with pytest.raises(ConfigError, match="config_file argument"):
        load_config(environ={"SLUICE_HOME": str(tmp_path)}, config_file=missing)
    # the default location may be missing: defaults apply
    assert load_config(environ={"SLUICE_HOME": str(tmp_path)}).triggerer.capacity == 1000


def test_secret_values_are_the_fernet_keys_and_the_database_password(tmp_path: Path) -> None:
    keys = [Fernet.generate_key().decode() for _ in range(2)]
    cfg = load_config(
        home=tmp_path,
        environ={
            "SLUICE__CORE__FERNET_KEY": ",".join(keys),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": "postgresql+psycopg://u:pw-0f-db@localhost/x",
        },
    )
    assert sorted(cfg.secret_values()) == sorted([*keys, "pw-0f-db"])


def test_the_local_executor_polls_at_the_idle_interval_and_the_celery_sender_at_the_loop(
    tmp_path,
) -> None:
    from engine.config import load_config
    from engine.executor.settings import ExecutorSettings

    home = {"SLUICE_HOME": str(tmp_path)}
    config = load_config(
        environ={
            **home,
            "SLUICE__SCHEDULER__LOOP_INTERVAL_SEC": "0.2",
            "SLUICE__SCHEDULER__IDLE_POLL_INTERVAL_SEC": "3",
        }
    )
    settings = ExecutorSettings.from_config(config)
    assert (settings.poll_interval_s, settings.sender_poll_s) == (3.0, 0.2)
    assert load_config(environ=home).scheduler.idle_poll_interval_sec == 1.0
