"""The smaller ``airflow.sdk`` names as a task sees them when it runs (``run_task`` in this
process, as the executor's task process runs it): ``literal``, ``get_parsing_context``,
``BaseOperatorLink``, ``SkipMixin`` / ``BranchMixIn``, ``TaskInstance``, ``macros``; and the
plain ones: ``ParamsDict``, ``conf``, ``BaseNotifier``, the enums, ``__version__``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

import engine
from engine import (
    BaseNotifier,
    DagRunState,
    Param,
    ParamsDict,
    TaskInstanceState,
    WeightRule,
    get_parsing_context,
)
from engine.authoring.configuration import SdkConfig
from engine.exceptions import ConfigError, ParamValidationError
from engine.execution.protocol import TaskSpec
from engine.execution.task_runner import run_task
from engine.executor.task_specs import build_context
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps

if TYPE_CHECKING:
    from pathlib import Path

DAG_FILE = """
from engine import (
    DAG, BaseOperator, BaseOperatorLink, BranchMixIn, EmptyOperator, PythonOperator, SkipMixin,
    TaskInstance, get_parsing_context, literal, macros, task,
)

BUILT.append(get_parsing_context())


class JobLink(BaseOperatorLink):
    name = "Job"

    def get_link(self, operator, *, ti_key):
        return f"https://jobs.example/{ti_key.dag_id}/{ti_key.run_id}/{operator.task_id}"


class BrokenLink(BaseOperatorLink):
    name = "Broken"

    def get_link(self, operator, *, ti_key):
        raise RuntimeError("no link today")


class Submit(BaseOperator):
    operator_extra_links = (JobLink(), BrokenLink())

    def execute(self, context):
        return "submitted"


class Choose(BaseOperator, BranchMixIn):
    def execute(self, context):
        return self.do_branch(context, "left")


class SkipOne(BaseOperator, SkipMixin):
    def execute(self, context):
        self.skip(context["ti"], tasks=[self.dag.get_task("b")])
        return "skipped b"


for dag_id in ("names", "other"):
    if get_parsing_context().dag_id not in (None, dag_id):
        continue  # the task process runs another DAG: skip building this one
    with DAG(dag_id):
        PythonOperator(
            task_id="echo",
            python_callable=lambda value: value,
            op_args=[literal("{{ not rendered }}")],
        )
        PythonOperator(
            task_id="dates",
            python_callable=lambda value: value,
            op_args=["{{ macros.ds_add(ds, 1) }}|{{ macros.ds_format(ds, '%Y-%m-%d', '%d/%m') }}"],
        )

        @task
        def is_ti(ti):
            return [isinstance(ti, TaskInstance), ti.task_id, ti.dag_id]

        is_ti()
        Submit(task_id="submit")
        choose = Choose(task_id="choose")
        choose >> [EmptyOperator(task_id="left"), EmptyOperator(task_id="right")]
        skip_one = SkipOne(task_id="skip_one")
        skip_one >> [EmptyOperator(task_id="a"), EmptyOperator(task_id="b")]
"""

LOGICAL = datetime(2026, 3, 8, tzinfo=UTC)


@pytest.fixture
def run(tmp_path: Path):
    dag_file = tmp_path / "names_dag.py"
    dag_file.write_text("import builtins\nBUILT = builtins.SLUICE_TEST_BUILT\n" + DAG_FILE)
    built: list[Any] = []
    import builtins

    builtins.SLUICE_TEST_BUILT = built  # type: ignore[attr-defined]

    def make(task_id: str, dag_id: str = "names") -> Any:
        context = build_context(
            dag_id=dag_id,
            run_id="r1",
            task_id=task_id,
            try_number=1,
            events=[],
            default_deferrable=False,
            run={"logical_date": LOGICAL, "conf": {}},
        )
        spec = TaskSpec(
            ti_id=1,
            dag_id=dag_id,
            run_id="r1",
            task_id=task_id,
            fileloc=str(dag_file),
            try_number=1,
            try_started_at=datetime.now(UTC).isoformat(),
            context=dumps(context),
        )
        result = run_task(spec)
        assert result.outcome == TaskState.SUCCESS, result.error
        return result

    make.built = built  # type: ignore[attr-defined]
    yield make
    del builtins.SLUICE_TEST_BUILT  # type: ignore[attr-defined]


def test_a_literal_reaches_the_task_unrendered_and_macros_render(run) -> None:
    assert deserialize_value(run("echo").return_value) == "{{ not rendered }}"
    assert deserialize_value(run("dates").return_value) == "2026-03-09|08/03"


def test_the_task_process_imports_the_file_for_its_dag_and_task(run) -> None:
    run("echo", dag_id="other")
    assert [tuple(c) for c in run.built] == [("other", "echo")]
    assert tuple(get_parsing_context()) == (None, None)  # outside: every DAG


def test_context_ti_is_a_task_instance(run) -> None:
    assert deserialize_value(run("is_ti").return_value) == [True, "is_ti", "names"]


def test_operator_links_are_stored_with_the_results_and_a_broken_one_is_left_out(run) -> None:
    xcoms = run("submit").xcoms
    assert deserialize_value(xcoms["_link_JobLink"]) == "https://jobs.example/names/r1/submit"
    assert "_link_BrokenLink" not in xcoms
    assert deserialize_value(xcoms["return_value"]) == "submitted"


def test_skip_mixins_skip_tasks_with_the_success(run) -> None:
    chose = run("choose")
    assert chose.skip_task_ids == ["right"]
    assert deserialize_value(chose.return_value) == "left"
    assert run("skip_one").skip_task_ids == ["b"]


# --- the plain names ----------------------------------------------------------------------------


def test_params_dict_hands_out_checked_values_and_keeps_the_params() -> None:
    params = ParamsDict({"limit": Param(5, type="integer", minimum=1), "mode": "full"})
    assert params["limit"] == 5 and params["mode"] == "full"
    assert isinstance(params.get_param("mode"), Param)
    assert all(isinstance(p, Param) for p in params.values())
    params["limit"] = 7
    assert params.dump() == {"limit": 7, "mode": "full"}
    with pytest.raises(ParamValidationError, match="limit"):
        params["limit"] = 0
    lenient = ParamsDict({"limit": Param(5, type="integer", minimum=1)}, suppress_exception=True)
    lenient["limit"] = 0
    assert lenient["limit"] == 0
    with engine.DAG("with_params_dict", params=params) as dag:
        pass
    assert dag.params["limit"].schema["minimum"] == 1


def test_conf_reads_the_effective_configuration_with_secrets_redacted(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    monkeypatch.setenv("SLUICE__CORE__PARALLELISM", "3")
    monkeypatch.setenv("SLUICE__CORE__FERNET_KEY", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=")
    conf = SdkConfig()
    assert conf.get("core", "parallelism") == "3"
    assert conf.getint("core", "parallelism") == 3
    assert conf.getboolean("operators", "default_deferrable") is False
    assert conf.get("core", "fernet_key") != "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI="
    assert conf.has_option("core", "dags_folder") and not conf.has_option("core", "nope")
    assert conf.get("core", "nope", fallback="x") == "x"
    with pytest.raises(ConfigError, match=r"no key 'nope' in \[core\]"):
        conf.get("core", "nope")
    with pytest.raises(ConfigError, match=r"no section \[nope\]"):
        conf.getsection("nope") or conf.get("nope", "x")


class Recorder(BaseNotifier):
    template_fields = ("message", "extra")
    sent: ClassVar[list[Any]] = []

    def __init__(self, message: str, extra: dict[str, str]) -> None:
        super().__init__()
        self.message = message
        self.extra = extra

    def notify(self, context: Any) -> None:
        if self.message == "boom":
            raise RuntimeError("the chat is down")
        self.sent.append((self.message, self.extra))


class FakeTi:
    def render_template(self, value: Any, context: Any, *, template_ext: Any = ()) -> Any:
        return f"rendered:{value}"


def test_a_notifier_renders_its_template_fields_then_notifies() -> None:
    Recorder.sent.clear()
    Recorder("{{ dag_id }} failed", {"k": "{{ run_id }}"})({"dag_id": "d", "run_id": "r"})
    assert Recorder.sent == [("d failed", {"k": "r"})]
    Recorder("x", {})({"ti": FakeTi()})  # a task's context renders as its templates do
    assert Recorder.sent[-1] == ("rendered:x", "rendered:{}")


def test_a_notifier_logs_a_failed_notification_instead_of_raising(caplog) -> None:
    Recorder("boom", {})({})
    assert "Failed to send notification with Recorder" in caplog.text


def test_the_enums_and_the_version() -> None:
    assert TaskInstanceState is TaskState and TaskInstanceState.SUCCESS == "success"
    assert DagRunState.FAILED == "failed"
    assert [w.value for w in WeightRule] == ["downstream", "upstream", "absolute"]
    assert isinstance(engine.__version__, str) and engine.__version__
    assert engine.BaseHook.__name__ == "BaseHook"
    assert engine.macros.ds_add("2026-01-31", 1) == "2026-02-01"
