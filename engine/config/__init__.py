"""Configuration: typed defaults < ``$SLUICE_HOME/sluice.toml`` < ``SLUICE__<SECTION>__<KEY>``.

The declared sections and keys (``sections``), loading them from the file and the
environment (``loading``), the effective configuration with its redaction and its display
(``effective``), and the URLs among the settings (``urls``). Import the names from here.
"""

from engine.config.effective import DEFAULT_SOURCE, SECRET_KEYS, Config, render_config
from engine.config.loading import (
    CONFIG_ENV_VAR,
    CONFIG_FILE_NAME,
    DEFAULT_HOME,
    ENV_PREFIX,
    HOME_ENV_VAR,
    load_config,
    sluice_home,
)
from engine.config.sections import (
    HEALTH_CHECK_HEARTBEAT_FACTOR,
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
)
from engine.config.urls import REDACTED

__all__ = [
    "CONFIG_ENV_VAR",
    "CONFIG_FILE_NAME",
    "DEFAULT_HOME",
    "DEFAULT_SOURCE",
    "ENV_PREFIX",
    "HEALTH_CHECK_HEARTBEAT_FACTOR",
    "HOME_ENV_VAR",
    "REDACTED",
    "SECRET_KEYS",
    "ApiConfig",
    "CeleryConfig",
    "Config",
    "CoreConfig",
    "ExecutorConfig",
    "LoggingConfig",
    "MetricsConfig",
    "OperatorsConfig",
    "SchedulerConfig",
    "StateStoreConfig",
    "TriggererConfig",
    "load_config",
    "render_config",
    "sluice_home",
]
