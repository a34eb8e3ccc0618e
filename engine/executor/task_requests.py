"""The executor's side of the task request channel (``engine.execution.task_channel``).

``TaskRequestServer.serve`` reads one JSON request per line from a task's process and
answers each from the metadata database, until the task closes its end. What it serves is
the table ``handlers`` (kind -> coroutine function of the request's fields): connections,
variables, results of other runs (``xcom_pull(dag_id=..., run_id=...)``), the last good
version of the task's own DAG file (its source as the DAG processor last parsed it well, for
a task whose file is broken now), ``TriggerDagRunOperator``'s run creation and run state
(``engine.executor.dag_run_requests``), the task and asset state stores
(``engine.executor.state_requests``), and the asset events that triggered the process's run,
page by page (``engine.executor.event_requests``); a later feature adds its kind there.

Secrets. Before answering with a connection or a sensitive variable, the server hands its
secrets to ``mask`` (the try's ``TaskLogWriter.add_secrets``): the task only learns a secret
after the log masks it, so whatever it prints is written as ``***``.

A request that cannot be read (not JSON, no kind, an unknown kind, over
``REQUEST_MAX_BYTES``) or that fails (a wrong Fernet key, the database down) gets an error
answer naming the kind and why; the task sees it as an exception, the executor never fails.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from engine.authoring.connections import Connection, InvalidConnectionError, is_sensitive
from engine.channel_server import NotFoundError, RequestError, RequestServer
from engine.db.queries import connections as store
from engine.db.queries import dags as dags_sql
from engine.db.queries import xcom_reads
from engine.exceptions import DecryptionError
from engine.executor import dag_run_requests
from engine.executor.event_requests import TriggeringEventRequests
from engine.executor.state_requests import StateStoreRequests

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from engine.crypto import KwargsCipher
    from engine.db.database import Database

logger = logging.getLogger(__name__)


class TaskRequestServer(RequestServer):
    """Answers one task process's requests; ``log_fields`` name the task in the engine log."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        mask: Callable[[Iterable[str]], None],
        log_fields: dict[str, Any] | None = None,
        dag_fileloc: str | None = None,
        ti_id: int | None = None,
        state_retention_days: int = 30,
        run: tuple[str, str] | None = None,
    ) -> None:
        self._db = db
        self._cipher = cipher
        self._mask = mask
        self._log_fields = log_fields or {}
        self._dag_fileloc = dag_fileloc  # the one DAG file whose last good version it serves
        super().__init__()
        self.handlers = {
            "get_connection": self.get_connection,
            "get_variable": self.get_variable,
            "set_variable": self.set_variable,
            "delete_variable": self.delete_variable,
            "mask": self.mask,
            "last_good_dag_file": self.last_good_dag_file,
            "pull_results": self.pull_results,
            "trigger_dag_run": self.trigger_dag_run,
            "dag_run_state": self.dag_run_state,
        }
        # the task (ti_id) and asset state stores (engine.executor.state_requests)
        self.state_store = StateStoreRequests(
            db=db, ti_id=ti_id, default_retention_days=state_retention_days
        )
        self.handlers.update(self.state_store.handlers())
        # the triggering events of ``run`` (dag_id, run_id): the process's own run, never
        # one the process names
        self.events = TriggeringEventRequests(db=db, run=run, log_fields=self._log_fields)
        self.handlers.update(self.events.handlers())

    # --- connections and variables ----------------------------------------------------

    async def get_connection(self, *, conn_id: str) -> dict[str, Any]:
        fields = await self._db.read(
            partial(store.get_connection, cipher=self._cipher, conn_id=conn_id)
        )
        if fields is None:
            raise NotFoundError(f"connection {conn_id!r} is not defined")
        try:
            conn = Connection.from_dict(conn_id, fields)
        except InvalidConnectionError as exc:
            raise RequestError(str(exc)) from exc
        self._mask(conn.secrets())
        self._log("task_connection_read", conn_id=conn_id)
        return fields

    async def get_variable(self, *, key: str) -> str:
        value = await self._db.read(partial(store.get_variable, cipher=self._cipher, key=key))
        if value is None:
            raise NotFoundError(f"variable {key!r} does not exist")
        if is_sensitive(key):
            self._mask([value])
        self._log("task_variable_read", key=key)
        return value

    async def set_variable(self, *, key: str, value: str, description: str | None) -> bool:
        if not isinstance(value, str):
            raise RequestError(f"variable {key!r}: the value must be text")
        if is_sensitive(key):
            self._mask([value])
        write = partial(
            store.set_variable, cipher=self._cipher, key=key, value=value, description=description
        )
        created = await self._db.run(write)
        self._log("task_variable_set", key=key)
        return created

    async def delete_variable(self, *, key: str) -> int:
        deleted = await self._db.run(partial(store.delete_variable, key=key))
        self._log("task_variable_deleted", key=key)
        return deleted

    async def mask(self, *, secrets: list[str]) -> None:
        if not isinstance(secrets, list) or not all(isinstance(s, str) for s in secrets):
            raise RequestError("mask: 'secrets' must be a list of strings")
        self._mask(secrets)

    # --- results of other runs (ti.xcom_pull with dag_id / run_id) ---------------------

    async def pull_results(
        self,
        *,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: int | None = None,
        include_prior_dates: bool = False,
        key: str | None = None,
    ) -> dict[str, Any]:
        """``{"run_id", "mapped", "stored": [{key: tagged JSON}, ...]}`` of ``task_id`` in
        that run (``engine.db.queries.xcom_reads``)."""
        read = partial(
            xcom_reads.pull_results,
            dag_id=str(dag_id),
            run_id=str(run_id),
            task_id=str(task_id),
            map_index=None if map_index is None else int(map_index),
            include_prior_dates=bool(include_prior_dates),
            key=None if key is None else str(key),
        )
        found = await self._db.read(read)
        if found is None:
            raise NotFoundError(f"no task {task_id!r} in run {run_id!r} of DAG {dag_id!r}")
        self._log("task_results_pulled", dag_id=dag_id, run_id=found.run_id, task_id=task_id)
        return {"run_id": found.run_id, "mapped": found.mapped, "stored": found.stored}

    # --- the task's DAG file ----------------------------------------------------------

    async def last_good_dag_file(self) -> dict[str, Any]:
        """The source of the task's DAG file as the DAG processor last parsed it well, only
        while the DAG processor has a parse error recorded for the file: a task whose file
        fails for another reason (a module missing on this worker, an edit the processor
        has not parsed yet) fails with its own error."""
        fileloc = self._dag_fileloc
        if fileloc is None:
            raise NotFoundError("this process has no DAG file to ask about")
        found = await self._db.read(partial(dags_sql.last_good_source, fileloc=fileloc))
        if found is None:
            raise NotFoundError(
                f"no parse error is recorded for {fileloc} (or no last good version of it is "
                "stored): the task fails with its own error"
            )
        token, parsed_at, parse_error = found
        try:
            source = self._cipher.decrypt(token)
        except DecryptionError as exc:
            raise RequestError(f"the last good version of {fileloc}: {exc}") from exc
        self._log("task_dag_file_read", fileloc=fileloc)
        return {
            "fileloc": fileloc,
            "source": source,
            "parsed_at": parsed_at.isoformat(),
            "parse_error": parse_error,
        }

    # --- DAG runs (TriggerDagRunOperator) ---------------------------------------------

    async def trigger_dag_run(self, **fields: Any) -> dict[str, Any]:
        answer = await self._db.run(
            partial(dag_run_requests.trigger_dag_run, **fields, now=datetime.now(UTC))
        )
        self._log("task_dag_run_triggered", dag_id=fields.get("dag_id"), **answer)
        return answer

    async def dag_run_state(self, *, dag_id: str, run_id: str) -> str:
        return await self._db.read(
            partial(dag_run_requests.dag_run_state, dag_id=dag_id, run_id=run_id)
        )

    def _log(self, action: str, **fields: Any) -> None:
        logger.debug(
            "Task request %s %s", action, fields, extra={"action": action, **self._log_fields}
        )
