"""The request channel from a task's process to the executor that supervises it.

A task's process has no database access and no Fernet key by design; what it needs from the
metadata database it asks its supervising executor for, over the request channel
(``engine.channel``: one JSON object per line each way) on a Unix socket pair the executor
creates when it starts the process (the child's end is passed as ``--channel-fd N``). Kinds
are a table (``engine.executor.task_requests``): a later feature adds a kind there and a
method here.

This module is the child's side: stdlib only (the task process stays light). It is the
connection/variable *store* of the task process (``engine.authoring.store``), and what
``TriggerDagRunOperator`` creates and watches runs through (``trigger_dag_run``,
``dag_run_state``), the backend of the task and asset state stores
(``engine.authoring.state_store``), and where ``triggering_asset_events`` reads the run's
events (``engine.execution.triggering_events``).
"""

from __future__ import annotations

import socket
from typing import Any

from engine.channel import (
    ANSWER_MAX_BYTES as ANSWER_MAX_BYTES,
)
from engine.channel import (
    REQUEST_MAX_BYTES as REQUEST_MAX_BYTES,
)
from engine.channel import (
    ChannelError as ChannelError,
)
from engine.channel import (
    NotFoundAnswer as NotFoundAnswer,
)
from engine.channel import RequestChannel


class TaskChannel(RequestChannel):
    """The task process's end: ``request(kind, **fields)`` returns the answer's value."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock, parent="the executor")

    @classmethod
    def from_fd(cls, fd: int) -> TaskChannel:
        return cls(socket.socket(fileno=fd))

    # --- the connection/variable store (engine.authoring.store.Store) --------------------

    def get_connection(self, conn_id: str) -> dict[str, Any] | None:
        fields = self.maybe("get_connection", conn_id=conn_id)
        if fields is not None and not isinstance(fields, dict):
            raise ChannelError(f"get_connection request: the answer for {conn_id!r} is not fields")
        return fields

    def get_variable(self, key: str) -> str | None:
        value = self.maybe("get_variable", key=key)
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
        found = self.maybe("pull_results", **fields)
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
        found = self.maybe("last_good_dag_file")
        if found is not None and not (
            isinstance(found, dict) and isinstance(found.get("source"), str)
        ):
            raise ChannelError("last_good_dag_file request: the answer is not a DAG file")
        return found if found is None else dict(found)

    # --- the run's triggering events (engine.execution.triggering_events) -------------

    def triggering_events(self, *, after_id: int | None, limit: int) -> dict[str, Any]:
        """``{"more": bool, "events": [event dict, ...]}``: up to ``limit`` of the asset
        events that triggered this process's run, those after event ``after_id``, in id
        order (payloads as stored: tagged JSON)."""
        page = self.request("triggering_events", after_id=after_id, limit=limit)
        if not (
            isinstance(page, dict)
            and isinstance(page.get("events"), list)
            and isinstance(page.get("more"), bool)
        ):
            raise ChannelError("triggering_events request: the answer is not a page of events")
        return page

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


def _found(answer: Any) -> tuple[bool, Any]:
    if not isinstance(answer, dict) or not isinstance(answer.get("found"), bool):
        raise ChannelError("state store request: the answer is not a lookup")
    return answer["found"], answer.get("value")
