"""A dags folder parsed into a migrated database, with the real scheduler, executor and
triggerer run in this process: for tests that follow runs from their start to their end
(``TriggerDagRunOperator``, ``ExternalTaskMarker``, mapped task groups, ...)."""

from __future__ import annotations

import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
from sqlalchemy import select

from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs
from engine.executor.local import LocalExecutor
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.waiting import eventually
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from datetime import datetime
    from pathlib import Path

ENDED = ("success", "failed")


class InProcessEngine:
    """``files``: name -> DAG file source (dedented), written to a dags folder and parsed."""

    def __init__(self, db_url: str, tmp_path: Path, files: dict[str, str]) -> None:
        self.dags = tmp_path / "dags"
        self.dags.mkdir()
        for name, source in files.items():
            (self.dags / name).write_text(textwrap.dedent(source))
        self.db, config, self.cipher, _ = parsed_database(db_url, tmp_path, self.dags)
        #: for the CLI run in-process (``click.testing.CliRunner``, obj={"config": ...})
        self.config = replace(config, core=replace(config.core, sql_alchemy_conn=db_url))
        self.settings = fast_executor_settings(config)
        self.scheduler = Scheduler(db=self.db, cipher=self.cipher, settings=SchedulerSettings())

    def trigger(
        self, dag_id: str, *, conf: Any = None, logical_date: datetime | None = None
    ) -> int:
        pk = self.db.call(
            lambda s: runs.create_run(
                s,
                dag_id,
                run_type=runs.MANUAL,
                now=models.utcnow(),
                conf=conf,
                logical_date=logical_date,
            )
        )
        assert pk is not None
        return int(pk)

    def run(self, run_pk: int) -> DagRun:
        run: DagRun = self.db.call(lambda s: s.get(DagRun, run_pk))
        return run

    def runs_of(self, dag_id: str) -> list[DagRun]:
        return self.db.call(
            lambda s: list(
                s.execute(
                    select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id)
                ).scalars()
            )
        )

    def instances(self, run_pk: int) -> list[TaskInstance]:
        return self.db.call(
            lambda s: list(
                s.execute(
                    select(TaskInstance)
                    .where(TaskInstance.dag_run_id == run_pk)
                    .order_by(TaskInstance.task_id, TaskInstance.map_index)
                ).scalars()
            )
        )

    def states(self, run_pk: int) -> dict[str, str]:
        """``{task_id: state}``; a mapped task's copies as ``task_id[i]``."""
        return {
            ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]": str(ti.state)
            for ti in self.instances(run_pk)
        }

    def xcom(
        self, run_pk: int, task_id: str, key: str = "return_value", map_index: int = -1
    ) -> Any:
        for ti in self.instances(run_pk):
            if ti.task_id == task_id and ti.map_index == map_index:
                return deserialize_value((ti.xcoms or {})[key])
        raise KeyError(f"no task instance {task_id}[{map_index}] in run {run_pk}")

    def log(self, run_pk: int, task_id: str, map_index: int = -1) -> str:
        """The log of the task's latest try."""
        run = self.run(run_pk)
        return read_task_log(
            self.settings.task_log_folder, run.dag_id, run.run_id, task_id, map_index=map_index
        )

    async def run_to_end(self, *run_pks: int, within: float = 60) -> list[str]:
        """Schedule until every run of ``run_pks`` ended; their states."""

        def read(session: Any) -> list[str]:
            return [str(session.get(DagRun, pk).state) for pk in run_pks]

        async def ended() -> list[str] | None:
            await self.scheduler.schedule_once()
            states = await self.db.run(read)
            return states if all(s in ENDED for s in states) else None

        result: list[str] = await eventually(ended, within=within, step=0.05)
        return result

    @asynccontextmanager
    async def running(self, *, triggerer: bool = False) -> AsyncIterator[None]:
        """The executor (and the triggerer), stopped at the end."""
        executor = LocalExecutor(db=self.db, cipher=self.cipher, settings=self.settings)
        part = Triggerer(
            db=self.db,
            cipher=self.cipher,
            settings=TriggererSettings(
                capacity=100,
                heartbeat_s=0.2,
                # one triggerer, no takeover under test: a lease that survives a loaded
                # machine (the suite's engines and browsers beside it) for 5 s without a beat
                health_check_threshold_s=5.0,
                claim_idle_interval_s=0.05,
                new_trigger_poll_s=0.05,
                shutdown_grace_s=2,
            ),
        )
        async with anyio.create_task_group() as tg:
            if triggerer:
                await tg.start(part.run)
            await tg.start(executor.run)
            try:
                yield
            finally:
                executor.shutdown()
                if triggerer:
                    part.shutdown()
