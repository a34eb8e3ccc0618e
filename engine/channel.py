"""The request channel between a parent process and the child it supervises: the child's end.

Theory of operation. A child that may run user code (a task's process, the child that
imports a DAG file) has no database access and no Fernet key; what it needs from the
metadata database it asks its parent (the executor, the DAG processor) for, over a Unix
socket pair the parent creates when it starts the child. Each message is one JSON object on
one line:

- request (child -> parent): ``{"id": 1, "kind": "get_connection", "conn_id": "pg"}``;
- answer (parent -> child): ``{"id": 1, "ok": true, "value": ...}`` or ``{"id": 1, "ok":
  false, "error": "...", "not_found": false}``.

One request is in flight at a time (a lock serializes the child's threads). A request is at
most ``REQUEST_MAX_BYTES`` and an answer at most ``ANSWER_MAX_BYTES`` of JSON; the parent
answers a request it cannot read, or whose answer would be too big, with an error naming
what was too big. The parent's end is ``engine.channel_server``; which kinds a parent serves
is its own table (``engine.executor.task_requests``, ``engine.dag_processing.parse_requests``).

Standard library only: the child stays light.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Final

from engine.exceptions import SluiceError

if TYPE_CHECKING:
    import socket

REQUEST_MAX_BYTES: Final = 64 * 1024
ANSWER_MAX_BYTES: Final = 8 * 1024 * 1024


class ChannelError(SluiceError, RuntimeError):
    """The parent did not answer a request (channel closed, malformed or refused)."""


class NotFoundAnswer(ChannelError, LookupError):
    """The parent answered that what was asked for does not exist."""


class RequestChannel:
    """The child's end: ``request(kind, **fields)`` returns the answer's value; ``parent``
    names the other end in errors ("the executor", "the DAG processor")."""

    def __init__(self, sock: socket.socket, *, parent: str = "the parent process") -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()
        self._next_id = 0
        self._parent = parent

    def __repr__(self) -> str:
        return f"<{type(self).__name__} fd={self._sock.fileno()} sent={self._next_id}>"

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def request(self, kind: str, **fields: Any) -> Any:
        """Send one request and wait for its answer; ``NotFoundAnswer`` / ``ChannelError``."""
        with self._lock:
            self._next_id += 1
            message = {"id": self._next_id, "kind": kind, **fields}
            line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
            if len(line) > REQUEST_MAX_BYTES:
                raise ChannelError(
                    f"{kind} request is {len(line):,} bytes, over the channel's limit of "
                    f"{REQUEST_MAX_BYTES:,}"
                )
            try:
                self._sock.sendall(line)
                answer = self._reader.readline(ANSWER_MAX_BYTES + 1)
            except OSError as exc:
                raise ChannelError(
                    f"{kind} request: {self._parent}'s channel failed: {exc}"
                ) from exc
            return self._value_of(kind, self._next_id, answer)

    def maybe(self, kind: str, **fields: Any) -> Any:
        """``request``, with None for an answer that says "not found"."""
        try:
            return self.request(kind, **fields)
        except NotFoundAnswer:
            return None

    def _value_of(self, kind: str, request_id: int, line: bytes) -> Any:
        if not line:
            raise ChannelError(
                f"{kind} request: {self._parent} closed the channel without answering"
            )
        if not line.endswith(b"\n"):
            raise ChannelError(f"{kind} request: the answer is over {ANSWER_MAX_BYTES:,} bytes")
        try:
            answer = json.loads(line)
        except ValueError as exc:
            raise ChannelError(f"{kind} request: unreadable answer: {exc}") from exc
        if not isinstance(answer, dict) or answer.get("id") != request_id:
            raise ChannelError(f"{kind} request: the answer does not match the request")
        if answer.get("ok"):
            return answer.get("value")
        error = str(answer.get("error") or "refused")
        raise (NotFoundAnswer if answer.get("not_found") else ChannelError)(error)
