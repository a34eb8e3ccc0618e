"""The request channel from a task's process to the executor that supervises it.

Theory of operation. A task's process has no database access and no Fernet key by design;
what it needs from the metadata database it asks its supervising executor for, over a Unix
socket pair the executor creates when it starts the process (the child's end is passed as
``--channel-fd N``). Each message is one JSON object on one line:

- request (child -> parent): ``{"id": 1, "kind": "get_connection", "conn_id": "pg"}``;
- answer (parent -> child): ``{"id": 1, "ok": true, "value": ...}`` or ``{"id": 1, "ok":
  false, "error": "...", "not_found": false}``.

One request is in flight at a time (a lock serializes the task's threads). A request is at
most ``REQUEST_MAX_BYTES`` and an answer at most ``ANSWER_MAX_BYTES`` of JSON; the parent
answers a request it cannot read, or whose answer would be too big, with an error naming
what was too big. Kinds are a table (``engine.executor.task_requests``): a later feature
adds a kind there and a method here.

This module is the child's side: stdlib only (the task process stays light). It is the
connection/variable *store* of the task process (``engine.authoring.store``), and what
``TriggerDagRunOperator`` creates and watches runs through (``trigger_dag_run``,
``dag_run_state``), and the backend of the task and asset state stores
(``engine.authoring.state_store``).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Final

from engine.exceptions import SluiceError

REQUEST_MAX_BYTES: Final = 64 * 1024
ANSWER_MAX_BYTES: Final = 8 * 1024 * 1024


class ChannelError(SluiceError, RuntimeError):
    """The executor did not answer a request (channel closed, malformed or refused)."""


class NotFoundAnswer(ChannelError, LookupError):
    """The executor answered that what was asked for does not exist."""


class TaskChannel:
    """The task process's end: ``request(kind, **fields)`` returns the answer's value."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()
        self._next_id = 0

    def __repr__(self) -> str:
        return f"<TaskChannel fd={self._sock.fileno()} sent={self._next_id}>"

    @classmethod
    def from_fd(cls, fd: int) -> TaskChannel:
        return cls(socket.socket(fileno=fd))

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
                raise ChannelError(f"{kind} request: the executor's channel failed: {exc}") from exc
            return _value_of(kind, self._next_id, answer)

    # --- the connection/variable store (engine.authoring.store.Store) --------------------

    def get_connection(self, conn_id: str) -> dict[str, Any] | None:
        fields = self._maybe("get_connection", conn_id=conn_id)
        if fields is not None and not isinstance(fields, dict):
            raise ChannelError(f"get_connection request: the answer for {conn_id!r} is not fields")
        return fields

    def get_variable(self, key: str) -> str | None:
        value = self._maybe("get_variable", key=key)
        return None if value is None else str(value)

    def set_variable(self, key: str, value: str, description: str | None) -> None:
        self.request("set_variable", key=key, value=value, description=description)

    def delete_variable(self, key: str) -> int:
        return int(self.request("delete_variable", key=key))

    def mask(self, secrets: list[str]) -> None:
        if secrets:
            self.request("mask", secrets=secrets)

    # --- results of other runs (engine.execution.results) ------------------------------

    def pull_results(self, **fields: Any) -> dict[str, Any] | None:
        """``{"run_id", "mapped", "stored"}`` of a task in another run (None: no such run
        or task); fields: dag_id, run_id, task_id, map_index, include_prior_dates, key."""
        found = self._maybe("pull_results", **fields)
        if found is not None and not (
            isinstance(found, dict) and isinstance(found.get("stored"), list)
        ):
            raise ChannelError("pull_results request: the answer is not results")
        return found

    # --- DAG runs (engine.authoring.trigger_dagrun.DagRunTriggering) -------------------

    def trigger_dag_run(
        self,
        *,
        dag_id: str,
        run_id: str | None,
        conf: Any,
        logical_date: str | None,
        reset_dag_run: bool,
        skip_when_already_exists: bool,
        fail_when_dag_is_paused: bool,
    ) -> dict[str, Any]:
        """Create a manual run of ``dag_id`` (or find the one that exists): ``{"outcome":
        created|reset|skipped|exists|paused, "run_id", "logical_date"}``."""
        answer = self.request(
            "trigger_dag_run",
            dag_id=dag_id,
            run_id=run_id,
            conf=conf,
            logical_date=logical_date,
            reset_dag_run=reset_dag_run,
            skip_when_already_exists=skip_when_already_exists,
            fail_when_dag_is_paused=fail_when_dag_is_paused,
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("run_id"), str):
            raise ChannelError(f"trigger_dag_run request: the answer for {dag_id!r} is not a run")
        return dict(answer)

    def dag_run_state(self, *, dag_id: str, run_id: str) -> str:
        """The state of run ``run_id`` of ``dag_id`` (``NotFoundAnswer`` if it is gone)."""
        return str(self.request("dag_run_state", dag_id=dag_id, run_id=run_id))

    # --- the task's DAG file (engine.execution.last_good) -------------------------------

    def last_good_dag_file(self) -> dict[str, Any] | None:
        """The task's DAG file as last parsed well: ``{"fileloc", "source", "parsed_at",
        "parse_error"}``; None unless the DAG processor has a parse error recorded for the
        file and a version of it stored."""
        found = self._maybe("last_good_dag_file")
        if found is not None and not (
            isinstance(found, dict) and isinstance(found.get("source"), str)
        ):
            raise ChannelError("last_good_dag_file request: the answer is not a DAG file")
        return found if found is None else dict(found)

    # --- the state stores (engine.authoring.state_store.StateStoring) ------------------

    def task_state_get(self, key: str) -> tuple[bool, Any]:
        """``(found, value)`` of ``key`` in this task instance's state store."""
        return _found(self.request("task_state_get", key=key))

    def task_state_set(
        self, key: str, value: Any, *, retention_s: float | None, never_expire: bool
    ) -> None:
        self.request(
            "task_state_set",
            key=key,
            value=value,
            retention_s=retention_s,
            never_expire=never_expire,
        )

    def task_state_delete(self, key: str) -> None:
        self.request("task_state_delete", key=key)

    def task_state_clear(self) -> None:
        self.request("task_state_clear")

    def asset_state_get(self, asset: str, key: str) -> tuple[bool, Any]:
        """``(found, value)`` of ``key`` in the state store of the asset named ``asset``."""
        return _found(self.request("asset_state_get", asset=asset, key=key))

    def asset_state_set(self, asset: str, key: str, value: Any) -> None:
        self.request("asset_state_set", asset=asset, key=key, value=value)

    def asset_state_delete(self, asset: str, key: str) -> None:
        self.request("asset_state_delete", asset=asset, key=key)

    def asset_state_clear(self, asset: str) -> None:
        self.request("asset_state_clear", asset=asset)

    def _maybe(self, kind: str, **fields: Any) -> Any:
        try:
            return self.request(kind, **fields)
        except NotFoundAnswer:
            return None


def _found(answer: Any) -> tuple[bool, Any]:
    if not isinstance(answer, dict) or not isinstance(answer.get("found"), bool):
        raise ChannelError("state store request: the answer is not a lookup")
    return answer["found"], answer.get("value")


def _value_of(kind: str, request_id: int, line: bytes) -> Any:
    if not line:
        raise ChannelError(f"{kind} request: the executor closed the channel without answering")
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
