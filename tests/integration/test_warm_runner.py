"""Task steps forked from the executor's warm runner (``engine.executor.warm_runner``): the
same isolation as a cold interpreter per step. A step that crashes, segfaults or is killed
fails alone; the executor and the warm runner carry on; a changed DAG file runs its new code
at the next step; a warm runner killed -9 is replaced, and the steps it forked before its
death finish."""

from __future__ import annotations

import errno
import os
import signal
import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import update

from engine.db import models
from engine.db.models import TaskInstance
from engine.db.queries import runs
from engine.executor import warm_process
from engine.executor.task_logs import read_task_log
from engine.states import TaskState
from engine.warm import service
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually, wait_until
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.executor.local import LocalExecutor
    from engine.executor.settings import ExecutorSettings
    from engine.executor.warm_process import WarmRunner

pytestmark = pytest.mark.integration

DAG_FILE = """
import ctypes
import os
import signal
import time
from pathlib import Path

from engine import DAG, task

VERSION = {version}
GATE = Path({gate!r})


@task
def ok():
    print("pid", os.getpid(), "pgid", os.getpgid(0), "ppid", os.getppid(), flush=True)
    return {{"version": VERSION, "pid": os.getpid()}}


@task
def exits():
    os._exit(3)


@task
def segfaults():
    ctypes.string_at(0)


@task
def kills_itself():
    os.kill(os.getpid(), signal.SIGKILL)


@task
def gated():
    print("waiting at the gate", flush=True)
    while not GATE.exists():
        time.sleep(0.02)
    return "through"


with DAG("warm"):
    ok()
    exits()
    segfaults()
    kills_itself()
    gated()
"""


class Env:
    def __init__(
        self,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        dag_file: Path,
        gate: Path,
    ) -> None:
        self.db, self.cipher, self.settings = db, cipher, settings
        self.dag_file, self.gate = dag_file, gate

    def new_run(self) -> tuple[str, dict[str, int]]:
        def create(session: Any) -> tuple[str, dict[str, int]]:
            pk = runs.create_run(session, "warm", run_type=runs.MANUAL, now=models.utcnow())
            state = runs.load_run_state(session, pk)
            assert state is not None
            run_id = session.get(models.DagRun, pk).run_id
            return str(run_id), state.ti_ids

        return self.db.call(create)

    def schedule(self, ti_id: int) -> None:
        self.db.call(
            lambda s: s.execute(
                update(TaskInstance)
                .where(TaskInstance.id == ti_id)
                .values(state=TaskState.SCHEDULED)
            )
        )

    async def run_task(self, task_id: str, *states: str) -> tuple[TaskInstance, str]:
        """Run one task of a new run until it is in one of ``states``; (ti, its log)."""
        run_id, tis = self.new_run()
        self.schedule(tis[task_id])

        async def done() -> TaskInstance | None:
            ti = await self.db.run(lambda s: s.get(TaskInstance, tis[task_id]))
            return ti if ti.state in states else None

        ti = await eventually(done, within=30)
        folder = self.settings.task_log_folder
        return ti, read_task_log(folder, "warm", run_id, task_id, None)

    @asynccontextmanager
    async def executor(self) -> AsyncIterator[LocalExecutor]:
        async with running_executor(self.db, self.cipher, self.settings) as executor:
            yield executor


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    gate = tmp_path / "gate"
    dag_file = dags / "warm_dag.py"
    dag_file.write_text(textwrap.dedent(DAG_FILE.format(version=1, gate=str(gate))))
    db, config, cipher, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, cipher, fast_executor_settings(config), dag_file, gate)
    db.dispose()


def warm(executor: LocalExecutor) -> WarmRunner:
    assert executor.warm_runner is not None
    return executor.warm_runner


async def test_a_step_is_forked_into_its_own_session_from_the_warm_runner(env: Env) -> None:
    with anyio.fail_after(60):
        async with env.executor() as executor:
            ti, log = await env.run_task("ok", TaskState.SUCCESS)
            runner = warm(executor)
            assert (runner.forks, runner.fallbacks) == (1, 0)
            assert ti.pid not in (runner.pid, os.getpid())
    assert deserialize_value(ti.xcoms["return_value"]) == {"version": 1, "pid": ti.pid}
    # a session and process group of its own, a child of the executor as a cold one is
    assert f"pid {ti.pid} pgid {ti.pid} ppid {os.getpid()}" in log
    assert "task succeeded" in log


@pytest.mark.parametrize(
    ("task_id", "reason"),
    [
        ("exits", "exited with code 3 without reporting an outcome"),
        ("segfaults", "exited with code -11 (signal SIGSEGV)"),
        ("kills_itself", "exited with code -9 (signal SIGKILL)"),
    ],
)
async def test_a_crashing_step_fails_alone_and_the_warm_runner_serves_on(
    env: Env, task_id: str, reason: str
) -> None:
    with anyio.fail_after(60):
        async with env.executor() as executor:
            crashed, log = await env.run_task(task_id, TaskState.FAILED)
            runner = warm(executor)
            pid = runner.pid
            ok, _ = await env.run_task("ok", TaskState.SUCCESS)
            assert (runner.pid, runner.starts, runner.forks, runner.fallbacks) == (pid, 1, 2, 0)
    assert reason in log
    assert crashed.end_date is not None
    assert ok.state == TaskState.SUCCESS


async def test_a_changed_dag_file_runs_its_new_code_at_the_next_step(env: Env) -> None:
    with anyio.fail_after(60):
        async with env.executor() as executor:
            first, _ = await env.run_task("ok", TaskState.SUCCESS)
            text = DAG_FILE.format(version=2, gate=str(env.gate))
            env.dag_file.write_text(textwrap.dedent(text))  # not re-parsed: the step reads it
            second, _ = await env.run_task("ok", TaskState.SUCCESS)
            assert warm(executor).forks == 2
    assert deserialize_value(first.xcoms["return_value"])["version"] == 1
    assert deserialize_value(second.xcoms["return_value"])["version"] == 2


async def test_a_warm_runner_killed_is_replaced_and_its_steps_in_flight_finish(
    env: Env,
) -> None:
    with anyio.fail_after(90):
        async with env.executor() as executor:
            runner = warm(executor)
            run_id, tis = env.new_run()
            env.schedule(tis["gated"])
            folder = env.settings.task_log_folder

            def at_gate() -> bool:
                try:
                    return "waiting at the gate" in read_task_log(folder, "warm", run_id, "gated")
                except FileNotFoundError:
                    return False

            await wait_until(lambda: runner.forks == 1, within=30)
            await wait_until(at_gate, within=30)
            first = runner.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            await wait_until(lambda: runner.ready and runner.pid != first, within=30)
            assert runner.starts == 2
            env.gate.touch()  # the step forked by the dead warm runner finishes

            async def gated_done() -> TaskInstance | None:
                ti = await env.db.run(lambda s: s.get(TaskInstance, tis["gated"]))
                return ti if ti.state in (TaskState.SUCCESS, TaskState.FAILED) else None

            gated = await eventually(gated_done, within=30)
            ok, _ = await env.run_task("ok", TaskState.SUCCESS)
            assert runner.forks == 2  # by the new warm runner
    assert gated.state == TaskState.SUCCESS
    assert deserialize_value(gated.xcoms["return_value"]) == "through"
    assert ok.state == TaskState.SUCCESS


async def test_a_step_runs_cold_while_no_warm_runner_is_ready(env: Env, monkeypatch) -> None:
    monkeypatch.setattr(service, "RESTART_BACKOFF_S", 600.0)  # stays down once dead
    with anyio.fail_after(60):
        async with env.executor() as executor:
            runner = warm(executor)
            await wait_until(lambda: runner.ready, within=30)
            assert runner.pid is not None
            os.kill(runner.pid, signal.SIGKILL)
            await wait_until(lambda: not runner.ready, within=30)
            ti, log = await env.run_task("ok", TaskState.SUCCESS)
            assert (runner.forks, runner.fallbacks) == (0, 1)
    assert "task succeeded" in log
    assert ti.state == TaskState.SUCCESS


async def test_a_standby_that_cannot_be_forked_leaves_steps_cold_until_a_retry_forks_one(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors for the standby's socket or pipe: the executor serves on (cold
    starts), and the warm runner forks standbys again once it can."""
    monkeypatch.setattr(service, "FORK_RETRY_BACKOFF_S", 0.05)
    real_fork = warm_process.WarmRunner._fork_standby
    failing, failures = [True], [0]

    async def fork(self: WarmRunner, control: Any, process: Any) -> Any:
        if failing[0]:
            failures[0] += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await real_fork(self, control, process)

    monkeypatch.setattr(warm_process.WarmRunner, "_fork_standby", fork)
    with anyio.fail_after(90):
        async with env.executor() as executor:
            runner = warm(executor)
            await wait_until(lambda: runner.ready and failures[0] >= 1, within=30)
            cold, _ = await env.run_task("ok", TaskState.SUCCESS)
            assert (runner.forks, runner.fallbacks) == (0, 1)
            failing[0] = False
            await wait_until(lambda: runner._standby is not None, within=30)
            forked, _ = await env.run_task("ok", TaskState.SUCCESS)
            assert (runner.forks, runner.fallbacks) == (1, 1)
    assert cold.state == forked.state == TaskState.SUCCESS


async def test_the_executor_can_run_without_a_warm_runner(env: Env) -> None:
    env.settings = replace(env.settings, warm_runner=False)
    with anyio.fail_after(60):
        async with env.executor() as executor:
            assert executor.warm_runner is None
            ti, _ = await env.run_task("ok", TaskState.SUCCESS)
    assert ti.state == TaskState.SUCCESS


# --- the warm runner process alone ----------------------------------------------------------

UNSAFE_MODULES = {
    "a thread": "import threading\nthreading.Thread(target=threading.Event().wait).start()\n",
    "a file": "HANDLE = open(__file__)\n",
}


def _start_warm_runner(dags: Path, env: dict[str, str], *skip: str) -> bytes:
    """Start ``python -m engine.executor.warm_runner`` on ``dags``; its first answer."""
    import socket
    import subprocess
    import sys

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    command = [sys.executable, "-P", "-m", "engine.executor.warm_runner"]
    command += ["--control-fd", str(theirs.fileno()), "--dag-folder", str(dags)]
    command += [arg for name in skip for arg in ("--skip", name)]
    with subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=env) as process:
        theirs.close()
        try:
            ours.settimeout(60)
            return ours.recv(4096)
        finally:
            ours.close()  # a ready warm runner exits when its control socket closes
            process.wait(timeout=60)


def test_packages_dag_files_import_are_preloaded_unless_in_the_dags_folder(tmp_path) -> None:
    from engine.executor.warm_runner import dag_imports

    dags = tmp_path / "dags"
    (dags / "sub").mkdir(parents=True)
    (dags / "helpers_mod.py").write_text("X = 1\n")
    (dags / "sub" / "etl.py").write_text(
        "import colorsys\nimport helpers_mod\nfrom wave import open as o\nfrom . import x\n"
        "import no_such_package_here\n\ndef f():\n    import xml.dom.minidom\n"
    )
    (dags / "broken.py").write_text("def (:\n")
    import sys

    sys.path.append(str(dags))  # even when found, a module of the dags folder is left out
    try:
        found = dag_imports([dags, tmp_path / "missing"])
    finally:
        sys.path.remove(str(dags))
    assert {"colorsys", "wave", "xml"} - set(sys.modules) <= set(found)
    assert "helpers_mod" not in found and "no_such_package_here" not in found


@pytest.mark.parametrize("what", sorted(UNSAFE_MODULES))
def test_a_dag_import_leaving_a_thread_or_a_file_open_is_refused_then_skipped(
    tmp_path, what: str
) -> None:
    import json

    site = tmp_path / "site"
    site.mkdir()
    (site / "threaded_pkg.py").write_text(UNSAFE_MODULES[what])
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "uses.py").write_text("import threaded_pkg\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    refusal = json.loads(_start_warm_runner(dags, env))
    assert refusal["skip"] == "threaded_pkg" and "forking is unsafe" in refusal["refused"]
    assert _start_warm_runner(dags, env, "threaded_pkg") == b"ready"
