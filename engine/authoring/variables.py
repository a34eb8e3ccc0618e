"""Variables, as Airflow 3 tasks use them: ``Variable.get(key, default=...,
deserialize_json=...)``, ``Variable.set(key, value, serialize_json=..., description=...)``,
``Variable.delete(key)`` (templates read them as ``{{ var.value.key }}``:
``engine.execution.accessors``).

A variable is looked up in ``SLUICE_VAR_<KEY>`` first, then in the store of the current
process (``engine.authoring.store``); the value of a variable whose key looks sensitive is
masked in the task log.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

from engine.authoring.connections import is_sensitive, var_env_name
from engine.authoring.store import current_store, mask_secrets

#: ``Variable.get``'s default: none given (a missing variable is a ``KeyError``)
NOT_SET: Final = object()


class Variable:
    """A named value (text, or JSON with ``deserialize_json``), Airflow's ``Variable``."""

    def __init__(self, key: str, value: str, description: str | None = None) -> None:
        self.key = key
        self.val = value
        self.description = description

    def __repr__(self) -> str:
        return f"<Variable {self.key}>"

    @staticmethod
    def get(key: str, default: Any = NOT_SET, deserialize_json: bool = False) -> Any:
        """The variable's value (``SLUICE_VAR_<KEY>`` first); ``default`` when undefined,
        else ``KeyError``."""
        text = os.environ.get(var_env_name(key))
        if text is not None:
            if is_sensitive(key):
                mask_secrets([text])
        else:
            text = current_store(f"Variable.get({key!r})").get_variable(key)
        if text is None:
            if default is NOT_SET:
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
