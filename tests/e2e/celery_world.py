"""An engine with ``[executor] kind = "celery"`` and real ``sluice celery worker``
subprocesses, for the Celery executor's end-to-end tests."""

from __future__ import annotations

import os
import signal
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance
from tests.cli import invoke
from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import (
    engine_env,
    log_tail,
    start_cli,
    start_engine,
    stop,
    wait_for,
)

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping
    from pathlib import Path

WORKER_READY = " ready."


@dataclass
class CeleryWorld:
    """``sluice run`` sending to Celery, and the workers a test starts (all stopped at the
    end, killed if they do not stop)."""

    root: Path
    env: dict[str, str]
    db: Database
    log: Path
    queue_prefix: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    engine: subprocess.Popen[bytes] | None = None

    def queue(self, name: str) -> str:
        return f"{self.queue_prefix}{name}"

    def start_engine(self, dag_ids: tuple[str, ...]) -> None:
        self.engine = start_engine(self.env, self.log)
        self.procs.append(self.engine)

        def parsed() -> bool:
            names = self.db.call(lambda s: set(s.execute(select(Dag.dag_id)).scalars().all()))
            return names >= set(dag_ids)

        wait_for(parsed, timeout=60, what=f"the DAGs {dag_ids} to be parsed")

    def start_worker(
        self, name: str, queues: tuple[str, ...] = ("default",), concurrency: int = 2
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """A ``sluice celery worker`` on ``queues`` (names without the test's prefix),
        returned once Celery says it is ready. Its tasks see ``SLUICE_TEST_WORKER=name``."""
        log = self.root / f"worker-{name}.log"
        names = ",".join(self.queue(q) for q in queues)
        args = ("celery", "worker", "-q", names, "-c", str(concurrency), "-n", f"{name}@test")
        proc = start_cli(*args, env={**self.env, "SLUICE_TEST_WORKER": name}, log=log)
        self.procs.append(proc)

        def ready() -> bool:
            assert proc.poll() is None, f"worker {name} exited:\n{log_tail(log)}"
            return WORKER_READY in log.read_text(errors="replace")

        wait_for(ready, timeout=60, what=f"worker {name} to be ready", step=0.1)
        return proc, log

    def trigger(self, dag_id: str) -> str:
        result = invoke("dags", "trigger", dag_id, env=self.env)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().rsplit(": ", 1)[1]

    def run_state(self, dag_id: str, run_id: str) -> str:
        query = select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        return str(self.db.call(lambda s: s.execute(query).scalar_one()))

    def wait_run(self, dag_id: str, run_id: str, *, timeout: float = 120) -> str:
        def ended() -> str | None:
            state = self.run_state(dag_id, run_id)
            return state if state in ("success", "failed") else None

        state = str(wait_for(ended, timeout=timeout, what=f"run {run_id} of {dag_id} to end"))
        assert state == "success", self.describe(dag_id)
        return state

    def task_states(self, dag_id: str) -> dict[str, Any]:
        query = select(TaskInstance.task_id, TaskInstance.state, TaskInstance.try_number).where(
            TaskInstance.dag_id == dag_id
        )
        return {t: (s, n) for t, s, n in self.db.call(lambda s: s.execute(query).all())}

    def results(self, dag_id: str) -> dict[str, Any]:
        """The stored results of the DAG's task instances, by task id."""
        query = select(TaskInstance.task_id, TaskInstance.xcoms).where(
            TaskInstance.dag_id == dag_id
        )
        return dict(self.db.call(lambda s: s.execute(query).all()))

    def describe(self, dag_id: str) -> str:
        workers = list(self.root.glob("worker-*.log"))
        tails = "\n".join(f"--- {w.name}\n{log_tail(w, 2000)}" for w in workers)
        return f"tasks: {self.task_states(dag_id)}\n--- engine\n{log_tail(self.log)}\n{tails}"

    def close(self) -> None:
        """SIGTERM every process still running at once (each shuts down on its own), then
        wait for each; one that does not stop in time fails the test."""
        live = [proc for proc in reversed(self.procs) if proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        errors = []
        for proc in live:
            try:
                stop(proc, timeout=30)
            except AssertionError as exc:
                errors.append(str(exc))
        self.db.dispose()
        assert not errors, errors


def make_world(
    root: Path,
    files: Mapping[str, str],
    *,
    template: Path,
    broker_url: str,
    queue_prefix: str,
    parallelism: int = 8,
    db_url: str | None = None,
    **settings: str,
) -> CeleryWorld:
    """A home and DAG folder in ``root``; the database is ``db_url`` (migrated) or a copy of
    the SQLite ``template``."""
    home, dags = root / "home", root / "dags"
    for folder in (home, dags):
        folder.mkdir()
    for name, source in files.items():
        (dags / name).write_text(textwrap.dedent(source))
    url = db_url or copy_sqlite_template(template, home / "sluice.db")
    # a broker blip (another test restarting RabbitMQ) costs seconds, not the default 10 min
    settings.setdefault("SLUICE__CELERY__TASK_QUEUED_TIMEOUT", "10")
    env = engine_env(
        home,
        url=url,
        dags=dags,
        parallelism=parallelism,
        SLUICE__EXECUTOR__KIND="celery",
        SLUICE__CELERY__BROKER_URL=broker_url,
        SLUICE__CELERY__DEFAULT_QUEUE=f"{queue_prefix}default",
        **settings,
    )
    return CeleryWorld(root, env, Database(url), root / "engine.log", queue_prefix)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker (no warm shutdown, no acknowledgement, no job end)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
