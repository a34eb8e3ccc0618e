"""``BaseHook``: the base of hooks, Airflow's ``airflow.hooks.base.BaseHook``.

A hook holds a ``conn_id`` and reads its connection with ``get_connection`` (environment
``SLUICE_CONN_<ID>`` first, then the metadata database through the executor; see
``engine.authoring.connections``). Sluice ships no service hooks: a ported hook subclasses
this one and builds its client from the connection.
"""

from __future__ import annotations

from typing import Any

from engine.authoring.connections import Connection


class BaseHook:
    """A hook: ``get_connection(conn_id)`` and ``get_conn()`` for subclasses to implement."""

    conn_name_attr: str = "conn_id"
    default_conn_name: str = "default_conn_id"
    conn_type: str = ""
    hook_name: str = ""

    def __init__(self, logger_name: str | None = None) -> None:
        self._logger_name = logger_name

    @classmethod
    def get_connection(cls, conn_id: str) -> Connection:
        """The connection ``conn_id`` (``AirflowNotFoundException`` when undefined)."""
        return Connection.get(conn_id)

    @classmethod
    def get_hook(cls, conn_id: str) -> BaseHook:
        raise NotImplementedError(
            f"{cls.__name__}.get_hook({conn_id!r}): Sluice ships no hook registry; build "
            "the hook class you need with the connection id"
        )

    def get_conn(self) -> Any:
        """The client this hook wraps; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_conn()")
