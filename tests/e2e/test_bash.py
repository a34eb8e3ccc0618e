"""BashOperator and ``@task.bash`` with ``sluice run`` as a subprocess: templates rendered
from the run (``{{ ds }}``, ``{{ params.x }}``, the run's conf), the output in the task
log and the last line as the result, a skip through exit code 99, and a failure."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.models import DagRun, TaskInstance
from tests.cli import invoke
from tests.e2e.helpers import running_engine, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from engine.db.database import Database

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DAGS = """
from engine import DAG, BashOperator, task

with DAG("bash_ok", schedule=None, params={"x": 3}):
    hello = BashOperator(
        task_id="hello",
        bash_command="echo starting; echo 'day {{ ds }} x={{ params.x }}'",
    )

    @task.bash(env={"RUN": "{{ run_id }}"}, append_env=True)
    def shout(line):
        return f'echo "{line}" | tr a-z A-Z; echo "run=$RUN" >&2; echo {{{{ ds_nodash }}}}'

    shout(hello.output)
    BashOperator(task_id="skip", bash_command="echo skipping; exit 99")


with DAG("bash_fails", schedule=None):
    BashOperator(task_id="fail", bash_command="echo about to fail >&2; exit 3")
"""


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("bash")
    with running_engine(
        root, {"bash_dags.py": DAGS}, ["bash_ok", "bash_fails"], template=sqlite_template
    ) as running:
        yield running


def _run_state(db: Database, run_id: str) -> str | None:
    run = db.call(lambda s: s.execute(select(DagRun).where(DagRun.run_id == run_id)).scalar())
    return None if run is None or run.state not in ("success", "failed") else run.state


def _task_states(db: Database, dag_id: str, run_id: str) -> dict[str, str]:
    def load(session: Any) -> dict[str, str]:
        run = session.execute(select(DagRun).where(DagRun.run_id == run_id)).scalar_one()
        rows = session.execute(select(TaskInstance).where(TaskInstance.dag_run_id == run.id))
        return {ti.task_id: ti.state for ti in rows.scalars()}

    return db.call(load)


def _trigger(env: dict[str, str], dag_id: str, *options: str) -> str:
    done = invoke("dags", "trigger", dag_id, "--json", *options, env=env)
    assert done.returncode == 0, done.stderr
    run_id: str = json.loads(done.stdout)["run_id"]
    return run_id


def _finish(engine: dict[str, Any], dag_id: str, *options: str) -> str:
    run_id = _trigger(engine["env"], dag_id, *options)
    state = wait_for(
        lambda: _run_state(engine["db"], run_id), timeout=120, what=f"the {dag_id} run to end"
    )
    return f"{state} {run_id}"


def _cli(env: dict[str, str], *args: str) -> str:
    done = invoke(*args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_templates_render_from_the_run_and_the_last_line_is_the_result(engine) -> None:
    env, db, log = engine["env"], engine["db"], engine["log"]
    state, run_id = _finish(
        engine, "bash_ok", "--logical-date", "2026-03-08T00:00:00+00:00", "--conf", '{"x": 9}'
    ).split()
    assert state == "success", log.read_text()[-3000:]
    assert _task_states(db, "bash_ok", run_id) == {
        "hello": "success",
        "shout": "success",
        "skip": "skipped",
    }
    hello = _cli(env, "tasks", "result", "bash_ok", run_id, "hello", "--key", "return_value")
    assert hello == "day 2026-03-08 x=9\n"
    shout = _cli(env, "tasks", "result", "bash_ok", run_id, "shout", "--json")
    assert json.loads(shout)["results"] == {"return_value": "20260308"}

    hello_log = _cli(env, "tasks", "logs", "bash_ok", run_id, "hello")
    assert "starting" in hello_log and "day 2026-03-08 x=9" in hello_log
    assert "Command exited with return code 0" in hello_log
    shout_log = _cli(env, "tasks", "logs", "bash_ok", run_id, "shout")
    assert "DAY 2026-03-08 X=9" in shout_log  # the upstream's result, passed to @task.bash
    assert f"run={run_id}" in shout_log  # env templates rendered, stderr in the log too


def test_exit_99_skips_the_task(engine) -> None:
    state, run_id = _finish(engine, "bash_ok", "--logical-date", "2026-03-09").split()
    assert state == "success"
    assert _task_states(engine["db"], "bash_ok", run_id)["skip"] == "skipped"
    skip_log = _cli(engine["env"], "tasks", "logs", "bash_ok", run_id, "skip")
    assert "skipping" in skip_log and "Bash command returned exit code 99. Skipping." in skip_log


def test_another_exit_code_fails_the_task_naming_the_code(engine) -> None:
    state, run_id = _finish(engine, "bash_fails").split()
    assert state == "failed"
    assert _task_states(engine["db"], "bash_fails", run_id) == {"fail": "failed"}
    fail_log = _cli(engine["env"], "tasks", "logs", "bash_fails", run_id, "fail")
    assert "about to fail" in fail_log
    assert "The command returned a non-zero exit code 3." in fail_log
