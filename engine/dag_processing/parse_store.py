"""Connections and variables in a DAG file's top-level code: the parsing child's store.

Theory of operation. Airflow's DAG processor answers ``Variable.get`` and ``Connection.get``
in a DAG file's module-level code (real DAG files read a variable to decide their tasks),
so Sluice's does too. The child that imports a file (``engine.dag_processing.parsing``) has
neither the database URL nor the Fernet key: the DAG processor starts it with an
environment stripped of them and hands it one end of a socket pair (``--request-fd N``).
This module is that end, installed as the child's store (``engine.authoring.store``): a
read asks the DAG processor, which reads the metadata database, decrypts, and answers with
the one value asked for (``engine.dag_processing.parse_requests``). The environment
(``SLUICE_VAR_<KEY>`` / ``SLUICE_CONN_<ID>``) answers first, as everywhere
(``Variable.get``).

Each answer is kept for the rest of the parse (a file that reads a variable in a loop asks
once), a missing one too. The store is read-only: ``Variable.set`` / ``delete`` at parse
time are refused with a ``StoreUnavailableError`` saying to do that in a task. The secrets
the child learns (a connection's password, a sensitive variable's value) are recorded
(``mask``) and replaced by ``***`` in the error the parse stores; the DAG processor masks
the same values again on its side, from what it served.

One JSON object per line, as the task channel: request ``{"id": 1, "kind": "get_variable",
"key": "k"}``, answer ``{"id": 1, "ok": true, "value": ...}`` or ``{"id": 1, "ok": false,
"not_found": true, "error": "..."}``. Standard library only (the child stays light).
"""

from __future__ import annotations

import json
import socket
from typing import Any, Final

from engine.authoring.store import StoreUnavailableError
from engine.exceptions import SluiceError

REQUEST_MAX_BYTES: Final = 64 * 1024
ANSWER_MAX_BYTES: Final = 8 * 1024 * 1024
_MISSING: Final = object()


class ParseRequestError(SluiceError, RuntimeError):
    """The DAG processor did not answer a parse-time read (channel closed, refused)."""


class ParseTimeStore:
    """The parsing child's read-only store: reads asked of the DAG processor, cached."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._next_id = 0
        self._cache: dict[tuple[str, str], Any] = {}
        #: secrets the child learned: masked in the error the parse stores
        self.secrets: set[str] = set()

    def __repr__(self) -> str:
        return f"<ParseTimeStore asked={self._next_id} cached={len(self._cache)}>"

    @classmethod
    def from_fd(cls, fd: int) -> ParseTimeStore:
        return cls(socket.socket(fileno=fd))

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def get_connection(self, conn_id: str) -> dict[str, Any] | None:
        fields = self._read("get_connection", "conn_id", conn_id)
        if fields is not None and not isinstance(fields, dict):
            raise ParseRequestError(f"Connection.get({conn_id!r}): the answer is not fields")
        return None if fields is None else dict(fields)

    def get_variable(self, key: str) -> str | None:
        value = self._read("get_variable", "key", key)
        return None if value is None else str(value)

    def set_variable(self, key: str, value: str, description: str | None) -> None:
        raise self._read_only(f"Variable.set({key!r})")

    def delete_variable(self, key: str) -> int:
        raise self._read_only(f"Variable.delete({key!r})")

    def mask(self, secrets: list[str]) -> None:
        self.secrets.update(secret for secret in secrets if secret)

    @staticmethod
    def _read_only(what: str) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"{what}: a DAG file's top-level code runs at every parse and may only read "
            "variables and connections; change them in a task, with `sluice variables set`, "
            "or in the UI"
        )

    def _read(self, kind: str, field: str, name: str) -> Any:
        cached = self._cache.get((kind, name), _MISSING)
        if cached is _MISSING:
            cached = self._ask(kind, field, name)
            self._cache[(kind, name)] = cached
        return cached

    def _ask(self, kind: str, field: str, name: str) -> Any:
        self._next_id += 1
        line = json.dumps({"id": self._next_id, "kind": kind, field: name}).encode() + b"\n"
        if len(line) > REQUEST_MAX_BYTES:
            raise ParseRequestError(f"{kind} {name!r:.80}: the request is too big")
        try:
            self._sock.sendall(line)
            answer_line = self._reader.readline(ANSWER_MAX_BYTES + 1)
        except OSError as exc:
            raise ParseRequestError(f"{kind} {name!r}: the DAG processor's channel failed") from exc
        return _value_of(kind, name, self._next_id, answer_line)


def _value_of(kind: str, name: str, request_id: int, line: bytes) -> Any:
    where = f"{kind} {name!r}"
    if not line.endswith(b"\n"):
        raise ParseRequestError(f"{where}: the DAG processor did not answer")
    try:
        answer = json.loads(line)
    except ValueError as exc:
        raise ParseRequestError(f"{where}: unreadable answer: {exc}") from exc
    if not isinstance(answer, dict) or answer.get("id") != request_id:
        raise ParseRequestError(f"{where}: the answer does not match the request")
    if answer.get("ok"):
        return answer.get("value")
    if answer.get("not_found"):
        return None
    raise ParseRequestError(f"{where}: {answer.get('error') or 'refused'}")
