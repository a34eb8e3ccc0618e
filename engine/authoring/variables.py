"""Variables, as Airflow 3 tasks use them: ``Variable.get(key, default=...,
deserialize_json=...)``, ``Variable.set(key, value, serialize_json=..., description=...)``,
``Variable.delete(key)``; and the ``var`` / ``conn`` accessors of templates and the task
context (``{{ var.value.key }}``, ``{{ var.json.key.field }}``, ``{{ conn.my_id.host }}``).

A variable is looked up in ``SLUICE_VAR_<KEY>`` first, then in the store of the current
process (``engine.authoring.connections``); the value of a variable whose key looks
sensitive is masked in the task log.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

from engine.authoring.connections import (
    Connection,
    current_store,
    is_sensitive,
    mask_secrets,
    var_env_name,
)
from engine.exceptions import AirflowNotFoundException

_NOT_SET: Final = object()


class Variable:
    """A named value (text, or JSON with ``deserialize_json``), Airflow's ``Variable``."""

    def __init__(self, key: str, value: str, description: str | None = None) -> None:
        self.key = key
        self.val = value
        self.description = description

    def __repr__(self) -> str:
        return f"<Variable {self.key}>"

    @staticmethod
    def get(key: str, default: Any = _NOT_SET, deserialize_json: bool = False) -> Any:
        """The variable's value (``SLUICE_VAR_<KEY>`` first); ``default`` when undefined,
        else ``KeyError``."""
        text = os.environ.get(var_env_name(key))
        if text is not None:
            if is_sensitive(key):
                mask_secrets([text])
        else:
            text = current_store(f"Variable.get({key!r})").get_variable(key)
        if text is None:
            if default is _NOT_SET:
                raise KeyError(f"Variable {key} does not exist")
            return default
        if not deserialize_json:
            return text
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"Variable {key!r} does not hold valid JSON: {exc}") from exc

    @staticmethod
    def set(
        key: str, value: Any, description: str | None = None, serialize_json: bool = False
    ) -> None:
        """Create or replace the variable (JSON-encoded with ``serialize_json``)."""
        text = json.dumps(value, indent=2) if serialize_json else str(value)
        current_store(f"Variable.set({key!r})").set_variable(key, text, description)

    @staticmethod
    def delete(key: str) -> int:
        """Delete the variable; how many were deleted (0 or 1)."""
        return current_store(f"Variable.delete({key!r})").delete_variable(key)


# --- template and context accessors: {{ var.value.key }}, {{ conn.my_id.host }} -----------


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

    def get(self, key: str, default: Any = _NOT_SET) -> Any:
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
