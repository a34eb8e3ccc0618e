"""The connection and variable store of the current process: the port through which
``Connection.get`` and ``Variable.get`` / ``set`` / ``delete`` reach the metadata database.

The store is installed by whoever can reach the database for the process: a task's (or
callback's) process, which has neither the database URL nor the Fernet key, installs its
request channel to the executor that supervises it when it starts
(``engine.execution.task_channel``); the DAG processor's parsing child installs a read-only
store that asks the DAG processor (``engine.dag_processing.parse_store``), so a DAG file's
top-level code reads them as in Airflow. Without a store (a DAG file imported by hand) only
the environment answers, and anything else is a clear ``StoreUnavailableError`` that says to
read connections and variables inside tasks or templates.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from engine.exceptions import SluiceError

#: the environment answers first: ``SLUICE_CONN_<ID>`` / ``SLUICE_VAR_<KEY>`` (Airflow's
#: ``AIRFLOW_CONN_`` / ``AIRFLOW_VAR_``)
CONN_ENV_PREFIX: Final = "SLUICE_CONN_"
VAR_ENV_PREFIX: Final = "SLUICE_VAR_"


class StoreUnavailableError(SluiceError, RuntimeError):
    """No connection/variable store here (a DAG file imported outside the engine), or a
    write where only reads are allowed (a DAG file's top-level code)."""


class Store(Protocol):
    """Where connections and variables come from, in the current process."""

    def get_connection(self, conn_id: str) -> dict[str, Any] | None:
        """The connection's fields (``Connection.to_dict()``), or None if undefined."""

    def get_variable(self, key: str) -> str | None:
        """The variable's text, or None if undefined."""

    def set_variable(self, key: str, value: str, description: str | None) -> None: ...

    def delete_variable(self, key: str) -> int:
        """How many variables were deleted (0 or 1)."""

    def mask(self, secrets: list[str]) -> None:
        """Keep ``secrets`` out of the task log (a no-op outside tasks)."""


_store: Store | None = None


def install_store(store: Store | None) -> Store | None:
    """Make ``store`` the current process's store; returns the previous one."""
    global _store
    previous, _store = _store, store
    return previous


def mask_secrets(secrets: list[str]) -> None:
    """Have the store mask ``secrets`` in the task log (nothing without a store)."""
    if _store is not None and secrets:
        _store.mask(secrets)


def current_store(what: str) -> Store:
    """The store of this process; ``StoreUnavailableError`` naming ``what`` if none."""
    if _store is None:
        raise StoreUnavailableError(
            f"{what}: connections and variables are not available here (a DAG file's "
            "top-level code runs at parse time, without them). Read them inside a task "
            "(Connection.get / Variable.get in its code) or in a template "
            "('{{ conn.my_id.host }}', '{{ var.value.my_key }}'); only "
            f"{CONN_ENV_PREFIX}<ID> / {VAR_ENV_PREFIX}<KEY> environment variables answer "
            "everywhere"
        )
    return _store
