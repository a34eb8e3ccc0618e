"""BashOperator and @task.bash: the command's output, exit codes (success, skip, failure),
cwd, environment, templates, definition errors, and stopping the command when interrupted."""

from __future__ import annotations

import logging
import os
import subprocess
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import DAG, BashOperator, DagDefinitionError, task
from engine.authoring import bash as bash_module
from engine.authoring.bash import BashTaskOperator, CommandResult, run_command
from engine.authoring.dag import take_registered_dags
from engine.exceptions import AirflowException, AirflowSkipException
from engine.execution.context import hydrate_context
from engine.execution.protocol import TaskSpec
from engine.execution.task_runner import run_task
from engine.execution.templates import TemplateRenderError, render_template_fields
from engine.executor.task_specs import build_context
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps

LOGICAL = datetime(2026, 3, 8, tzinfo=UTC)
BASH_LOGGER = "engine.authoring.bash"


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def context_for(op: Any, logical_date: datetime | None = LOGICAL) -> dict[str, Any]:
    run = {"run_id": "manual__1", "logical_date": logical_date, "conf": {}}
    raw = {"dag_id": "sh", "run_id": "manual__1", "task_id": op.task_id, "try_number": 3}
    return hydrate_context({**raw, "run": run}, op)


def run(op: Any, logical_date: datetime | None = LOGICAL) -> Any:
    """What the task runner does: render the template fields, then execute."""
    context = context_for(op, logical_date)
    render_template_fields(op, context)
    return op.execute(context)


def bash(command: str, **kwargs: Any) -> BashOperator:
    with DAG("sh", schedule=None, auto_register=False, params={"x": 7}):
        return BashOperator(task_id="b", bash_command=command, **kwargs)


def output_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == BASH_LOGGER and getattr(r, "action", None) == "bash_output"
    ]


# --- exit codes ---------------------------------------------------------------------------------


def test_success_returns_the_last_line_and_logs_every_line(caplog) -> None:
    caplog.set_level(logging.INFO, logger=BASH_LOGGER)
    op = bash("echo first; echo to-stderr >&2; printf 'last  \\n'")
    assert run(op) == "last"
    assert output_lines(caplog) == ["first", "to-stderr", "last"]
    exits = [r for r in caplog.records if getattr(r, "action", None) == "bash_exit"]
    assert [r.exit_code for r in exits] == [0]  # type: ignore[attr-defined]


def test_no_output_is_an_empty_result() -> None:
    assert run(bash("true")) == ""


def test_the_skip_exit_code_skips_the_task() -> None:
    with pytest.raises(AirflowSkipException, match=r"exit code 99\. Skipping"):
        run(bash("echo skipping; exit 99"))


@pytest.mark.parametrize(
    ("codes", "exit_code", "skips"),
    [([3, 4], 4, True), (5, 5, True), (None, 99, False), ([], 99, False), ((1,), 2, False)],
)
def test_skip_on_exit_code_takes_an_int_a_list_or_none(codes, exit_code, skips) -> None:
    op = bash(f"exit {exit_code}", skip_on_exit_code=codes)
    kind = AirflowSkipException if skips else AirflowException
    with pytest.raises(kind) as caught:
        run(op)
    assert skips or type(caught.value) is AirflowException


def test_another_exit_code_fails_the_task_naming_it() -> None:
    with pytest.raises(AirflowException) as caught:
        run(bash("echo broken >&2; exit 3"))
    assert str(caught.value) == (
        "Bash command failed. The command returned a non-zero exit code 3."
    )


def test_bad_bytes_are_kept_escaped_and_output_encoding_is_used() -> None:
    assert run(bash("printf 'caf\\xe9\\n'")) == "caf\\xe9"
    assert run(bash("printf 'caf\\xe9\\n'", output_encoding="latin-1")) == "café"


def test_output_processor_shapes_the_result() -> None:
    assert run(bash("echo 1,2,3", output_processor=lambda line: line.split(","))) == [
        "1",
        "2",
        "3",
    ]


# --- cwd and environment -------------------------------------------------------------------------


def test_the_command_runs_in_cwd(tmp_path: Path) -> None:
    assert run(bash("pwd", cwd=str(tmp_path))) == str(tmp_path)


def test_without_cwd_the_command_runs_in_a_temporary_folder_removed_after() -> None:
    folder = Path(run(bash("pwd")))
    assert folder.name.startswith("sluicetmp")
    assert not folder.exists()


def test_a_missing_cwd_fails(tmp_path: Path) -> None:
    with pytest.raises(AirflowException, match=r"task 'b': cannot find the cwd '.*/nope'"):
        run(bash("pwd", cwd=str(tmp_path / "nope")))
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(AirflowException, match="must be a directory"):
        run(bash("pwd", cwd=str(a_file)))


def test_the_environment_is_the_task_process_one_by_default(monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_TEST_VALUE", "from-os")
    assert run(bash("echo $SLUICE_TEST_VALUE")) == "from-os"
    only = bash('echo "${SLUICE_TEST_VALUE:-unset} $MINE"', env={"MINE": "mine"})
    assert run(only) == "unset mine"
    both = bash("echo $SLUICE_TEST_VALUE $MINE", env={"MINE": "mine"}, append_env=True)
    assert run(both) == "from-os mine"


def test_airflow_context_variables_are_set() -> None:
    op = bash(
        "echo $AIRFLOW_CTX_DAG_ID $AIRFLOW_CTX_TASK_ID $AIRFLOW_CTX_DAG_RUN_ID "
        "$AIRFLOW_CTX_TRY_NUMBER $AIRFLOW_CTX_LOGICAL_DATE $AIRFLOW_CTX_DAG_OWNER",
        env={},
    )
    assert run(op) == "sh b manual__1 3 2026-03-08T00:00:00+00:00 airflow"
    no_date = bash("echo ${AIRFLOW_CTX_LOGICAL_DATE:-none}")
    assert run(no_date, logical_date=None) == "none"


def test_env_values_must_be_str() -> None:
    with pytest.raises(AirflowException, match=r"env names and values must be str.*'N'"):
        run(bash("true", env={"N": 1}))  # type: ignore[dict-item]


# --- templates ----------------------------------------------------------------------------------


def test_command_env_and_cwd_are_templates(tmp_path: Path) -> None:
    (tmp_path / "2026-03-08").mkdir()
    op = bash(
        "echo {{ ds }} {{ params.x }} $DAY",
        env={"DAY": "{{ ds_nodash }}"},
        cwd=str(tmp_path) + "/{{ ds }}",
    )
    assert run(op) == "2026-03-08 7 20260308"
    assert op.bash_command == "echo 2026-03-08 7 $DAY"  # rendered on the instance
    assert op.cwd == str(tmp_path / "2026-03-08")
    assert BashOperator.template_fields == ("bash_command", "env", "cwd")
    assert BashOperator.template_ext == (".sh", ".bash")


def test_an_undefined_name_in_the_command_names_field_and_name() -> None:
    with pytest.raises(TemplateRenderError) as caught:
        run(bash("echo {{ params.y }}"))
    assert "task 'b': template field 'bash_command': 'dict object' has no attribute 'y'" in str(
        caught.value
    )


def test_a_result_in_the_command_links_the_task_and_is_its_value() -> None:
    with DAG("sh", schedule=None, auto_register=False) as d:

        @task
        def name() -> str:
            return "{{ not rendered }}"

        op = BashOperator(task_id="b", bash_command=f"echo {name().output}")
        direct = BashOperator(task_id="c", bash_command=name.override(task_id="n2")().output)
    assert d.get_task("b").upstream_task_ids == set()  # text mentioning it: no link, as Airflow
    assert direct.upstream_task_ids == {"n2"}
    assert "xcom_pull(task_ids='name'" in op.bash_command


# --- @task.bash ------------------------------------------------------------------------------


def test_task_bash_runs_the_returned_command_rendered() -> None:
    with DAG("sh", schedule=None, auto_register=False, params={"x": 7}):

        @task.bash(env={"GREETING": "hi {{ ds }}"})
        def greet(who: str, ds=None) -> str:
            return f'echo "$GREETING {who} {ds}" {{{{ params.x }}}}'

        op = greet("ann")
    assert isinstance(op, BashTaskOperator) and op.task_id == "greet"
    assert (
        repr(greet)
        == "<@task.bash 'test_task_bash_runs_the_returned_command_rendered.<locals>.greet'>"
    )
    assert run(op) == "hi 2026-03-08 ann 2026-03-08 7"
    assert op.bash_command == 'echo "$GREETING ann 2026-03-08" 7'


def test_task_bash_skips_and_fails_like_bash_operator() -> None:
    with DAG("sh", schedule=None, auto_register=False):

        @task.bash(skip_on_exit_code=[2])
        def code(n: int) -> str:
            return f"exit {n}"

        skip, fail = code(2), code(1)
    assert fail.task_id == "code__1"
    with pytest.raises(AirflowSkipException):
        run(skip)
    with pytest.raises(AirflowException, match="exit code 1"):
        run(fail)


@pytest.mark.parametrize("returned", [None, "", "   ", 3])
def test_task_bash_must_return_a_command(returned: Any) -> None:
    with DAG("sh", schedule=None, auto_register=False):

        @task.bash
        def nothing() -> Any:
            return returned

        op = nothing()
    with pytest.raises(TypeError, match=r"a @task\.bash function returns the command to run"):
        run(op)


# --- definition errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bash_command": ""}, "bash_command must be a non-empty str"),
        ({"bash_command": ["ls"]}, "bash_command must be a non-empty str"),
        ({"bash_command": "ls", "skip_on_exit_code": "99"}, "skip_on_exit_code must be an int"),
        ({"bash_command": "ls", "skip_on_exit_code": [1.5]}, "a list of ints"),
        ({"bash_command": "ls", "env": ["A=1"]}, "env must be a dict"),
        ({"bash_command": "ls", "cwd": 3}, "cwd must be a str"),
        ({"bash_command": "ls", "output_processor": "strip"}, "must be callable"),
    ],
)
def test_bad_arguments_are_definition_errors(kwargs: dict[str, Any], message: str) -> None:
    with DAG("sh", schedule=None, auto_register=False), pytest.raises(DagDefinitionError) as e:
        BashOperator(task_id="b", **kwargs)
    assert message in str(e.value) and "task 'b'" in str(e.value)


def test_default_args_fill_bash_arguments() -> None:
    with DAG("sh", schedule=None, auto_register=False, default_args={"cwd": "/", "retries": 2}):
        op = BashOperator(task_id="b", bash_command="pwd")
    assert (op.cwd, op.retries) == ("/", 2)
    assert run(op) == "/"


# --- stopping --------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def test_an_interrupted_task_stops_its_command(monkeypatch, tmp_path: Path) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real_popen(*args, **kwargs)
        started.append(process)
        return process

    class InterruptOnReady:
        """The logger: interrupts (as the execution timeout would) once the command runs."""

        def info(self, message: str, *args: Any, **kwargs: Any) -> None:
            if args == ("ready",):
                raise Interrupted

    monkeypatch.setattr(bash_module.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(bash_module, "logger", InterruptOnReady())
    with pytest.raises(Interrupted):
        run_command(
            ["bash", "-c", "echo ready; exec sleep 60"],
            env=dict(os.environ),
            cwd=str(tmp_path),
            output_encoding="utf-8",
        )
    (process,) = started
    assert process.returncode is not None  # stopped and reaped, not left running
    assert process.stdout is not None and process.stdout.closed


def test_run_command_reports_the_exit_code(tmp_path: Path) -> None:
    result = run_command(
        ["bash", "-c", "echo a; echo b; exit 4"], env={}, cwd=str(tmp_path), output_encoding="utf-8"
    )
    assert result == CommandResult(4, "b")


# --- through the task runner: outcomes and the execution timeout ------------------------------

DAG_FILE = """
from datetime import timedelta

from engine import DAG, BashOperator, task

with DAG("files", schedule=None, params={"who": "ann"}):
    BashOperator(task_id="script", bash_command="scripts/hello.sh")
    BashOperator(task_id="skip", bash_command="exit 99")
    BashOperator(task_id="fail", bash_command="exit 5")
    BashOperator(
        task_id="slow",
        bash_command="echo started; exec sleep 60",
        execution_timeout=timedelta(seconds=0.5),
    )

    @task.bash
    def script_task():
        return "scripts/hello.sh"

    script_task()
"""


@pytest.fixture
def spec_for(tmp_path: Path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "hello.sh").write_text(
        textwrap.dedent(
            """\
            # a template file: rendered, then run with bash -c
            echo "hello {{ params.who }} on {{ ds }}"
            """
        )
    )
    dag_file = tmp_path / "files_dag.py"
    dag_file.write_text(textwrap.dedent(DAG_FILE))

    def make(task_id: str) -> TaskSpec:
        context = build_context(
            dag_id="files",
            run_id="r",
            task_id=task_id,
            try_number=1,
            events=[],
            default_deferrable=False,
            run={"logical_date": LOGICAL, "conf": {}},
        )
        return TaskSpec(
            ti_id=1,
            dag_id="files",
            run_id="r",
            task_id=task_id,
            fileloc=str(dag_file),
            try_number=1,
            try_started_at=datetime.now(UTC).isoformat(),
            context=dumps(context),
        )

    return make


@pytest.mark.parametrize("task_id", ["script", "script_task"])
def test_a_script_file_is_rendered_and_run(spec_for, task_id: str) -> None:
    result = run_task(spec_for(task_id))
    assert result.outcome == TaskState.SUCCESS, result.error
    assert deserialize_value(result.return_value) == "hello ann on 2026-03-08"


def test_exit_codes_become_outcomes(spec_for) -> None:
    skipped = run_task(spec_for("skip"))
    assert skipped.outcome == TaskState.SKIPPED
    failed = run_task(spec_for("fail"))
    assert failed.outcome == TaskState.FAILED
    assert failed.error == (
        "AirflowException: Bash command failed. The command returned a non-zero exit code 5."
    )


@pytest.mark.timeout(30)
def test_the_execution_timeout_stops_the_command(spec_for) -> None:
    result = run_task(spec_for("slow"))
    assert result.outcome == TaskState.FAILED and result.timed_out
    assert result.elapsed_s < timedelta(seconds=20).total_seconds()
