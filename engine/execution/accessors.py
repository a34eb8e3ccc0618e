"""``var`` and ``conn`` of the task context and templates: ``{{ var.value.key }}``,
``{{ var.json.key.field }}``, ``{{ var.value.get("key", "fallback") }}``, ``{{
conn.my_id.host }}``, ``{{ conn.get("my-id").login }}``.

Each read is a ``Variable.get`` / ``Connection.get`` (``engine.authoring``): the
environment first, then the store of the task process (its executor, over the request
channel); the secrets read are masked in the task log.
"""

from __future__ import annotations

from typing import Any

from engine.authoring.connections import Connection
from engine.authoring.variables import NOT_SET, Variable
from engine.exceptions import AirflowNotFoundException


class _VariableAccessor:
    """``var.value`` / ``var.json``: ``.<key>`` or ``.get(key, default)``."""

    def __init__(self, *, deserialize_json: bool) -> None:
        self._json = deserialize_json

    def __repr__(self) -> str:
        return f"<VariableAccessor json={self._json}>"

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return Variable.get(key, deserialize_json=self._json)

    def get(self, key: str, default: Any = NOT_SET) -> Any:
        return Variable.get(key, default=default, deserialize_json=self._json)


class VariableAccessors:
    """The ``var`` of templates and the task context: ``var.value.key``, ``var.json.key``."""

    def __init__(self) -> None:
        self.value = _VariableAccessor(deserialize_json=False)
        self.json = _VariableAccessor(deserialize_json=True)

    def __repr__(self) -> str:
        return "<VariableAccessors value json>"


class ConnectionAccessor:
    """The ``conn`` of templates and the task context: ``conn.my_id.host``,
    ``conn.get("my-id")`` (for ids that are not identifiers)."""

    def __repr__(self) -> str:
        return "<ConnectionAccessor>"

    def __getattr__(self, conn_id: str) -> Connection:
        if conn_id.startswith("__"):
            raise AttributeError(conn_id)
        return Connection.get(conn_id)

    def get(self, conn_id: str, default_conn: Any = None) -> Any:
        try:
            return Connection.get(conn_id)
        except AirflowNotFoundException:
            return default_conn
