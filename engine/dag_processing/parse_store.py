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

The protocol is the request channel's (``engine.channel``), as for a task's process: one
JSON object per line each way. Standard library only (the child stays light).
"""

from __future__ import annotations

import socket
from typing import Any, Final

from engine.authoring.store import StoreUnavailableError
from engine.channel import ChannelError, RequestChannel

_MISSING: Final = object()


class ParseRequestError(ChannelError):
    """The DAG processor did not answer a parse-time read (channel closed, refused)."""


class ParseTimeStore:
    """The parsing child's read-only store: reads asked of the DAG processor, cached."""

    def __init__(self, sock: socket.socket) -> None:
        self._channel = RequestChannel(sock, parent="the DAG processor")
        self._asked = 0
        self._cache: dict[tuple[str, str], Any] = {}
        #: secrets the child learned: masked in the error the parse stores
        self.secrets: set[str] = set()

    def __repr__(self) -> str:
        return f"<ParseTimeStore asked={self._asked} cached={len(self._cache)}>"

    @classmethod
    def from_fd(cls, fd: int) -> ParseTimeStore:
        return cls(socket.socket(fileno=fd))

    def close(self) -> None:
        self._channel.close()

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
        self._asked += 1
        try:
            return self._channel.maybe(kind, **{field: name})
        except ChannelError as exc:
            raise ParseRequestError(f"{kind} {name!r}: {exc}") from exc
