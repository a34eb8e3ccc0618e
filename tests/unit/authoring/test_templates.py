"""Templates: template_fields rendered with Jinja2 from the task context (names, macros,
filters, containers, template files), StrictUndefined errors, and the task runner's hook."""

from __future__ import annotations

import json
import textwrap
import uuid
from collections import namedtuple
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from engine import DAG, BaseOperator, PythonOperator, dag, task
from engine.authoring.dag import take_registered_dags
from engine.execution.context import hydrate_context
from engine.execution.protocol import TaskSpec
from engine.execution.task_runner import run_task
from engine.execution.templates import (
    MACROS,
    TemplateRenderError,
    ds_add,
    ds_format,
    render_template,
    render_template_fields,
    template_context,
)
from engine.executor.task_specs import build_context
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps, serialize_value

if TYPE_CHECKING:
    from pathlib import Path

LOGICAL = datetime(2026, 3, 8, 7, 30, tzinfo=UTC)
INTERVAL_END = datetime(2026, 3, 9, 7, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


class Templated(BaseOperator):
    """An operator whose ``text`` and ``items`` are templates."""

    template_fields = ("text", "items")

    def __init__(self, *, text: Any = "", items: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.text = text
        self.items = items

    def execute(self, context: Any) -> Any:
        return self.text


def raw_context(task_id: str, *, logical_date: datetime | None = LOGICAL, **extra: Any) -> dict:
    run = {
        "run_id": "scheduled__2026-03-08",
        "run_type": "scheduled",
        "logical_date": logical_date,
        "data_interval_start": logical_date,
        "data_interval_end": INTERVAL_END if logical_date else None,
        "conf": {},
    }
    return {
        "dag_id": "tpl",
        "run_id": run["run_id"],
        "task_id": task_id,
        "try_number": 2,
        "run": run,
        **extra,
    }


def context_for(op: BaseOperator, **raw: Any) -> dict[str, Any]:
    return hydrate_context(raw_context(op.task_id, **raw), op)


def rendered(text: Any, **raw: Any) -> Any:
    with DAG("tpl", schedule=None, auto_register=False, params={"x": 5, "name": "ann"}) as d:
        op = Templated(task_id="t", text=text)
    assert d is not None
    render_template_fields(op, context_for(op, **raw))
    return op.text


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ ds }}", "2026-03-08"),
        ("{{ ds_nodash }}", "20260308"),
        ("{{ ts }}", "2026-03-08T07:30:00+00:00"),
        ("{{ ts_nodash }}", "20260308T073000"),
        ("{{ ts_nodash_with_tz }}", "20260308T073000+0000"),
        ("{{ logical_date.year }}-{{ logical_date.month }}", "2026-3"),
        ("{{ data_interval_start.isoformat() }}", "2026-03-08T07:30:00+00:00"),
        ("{{ data_interval_end | ds }}", "2026-03-09"),
        ("{{ data_interval_end | ds_nodash }}", "20260309"),
        ("{{ data_interval_end | ts_nodash }}", "20260309T073000"),
        ("{{ params.x * 2 }} {{ params['name'] }}", "10 ann"),
        ("{{ dag_run.run_id }} {{ dag_run.run_type }}", "scheduled__2026-03-08 scheduled"),
        ("{{ run_id }}", "scheduled__2026-03-08"),
        ("{{ task.task_id }} {{ dag.dag_id }}", "t tpl"),
        ("{{ ti.task_id }} try {{ ti.try_number }}", "t try 2"),
        ("{{ task_instance_key_str }}", "tpl__t__20260308"),
        ("{% set n = 3 %}{% for i in range(n) %}{{ i }}{% endfor %}", "012"),
        ("{% set seen = [] %}{% do seen.append(1) %}{{ seen }}", "[1]"),
        ("no template at all", "no template at all"),
    ],
)
def test_templates_see_the_task_context(template: str, expected: str) -> None:
    assert rendered(template) == expected


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ macros.ds_add(ds, 7) }}", "2026-03-15"),
        ("{{ macros.ds_add(ds, -8) }}", "2026-02-28"),
        ("{{ macros.ds_format(ds, '%Y-%m-%d', '%d/%m/%Y') }}", "08/03/2026"),
        ("{{ (logical_date + macros.timedelta(days=1)).day }}", "9"),
        ("{{ macros.datetime(2020, 1, 2).strftime('%Y') }}", "2020"),
        ("{{ macros.json.dumps({'a': params.x}) }}", '{"a": 5}'),
        ("{{ macros.time.time() > 0 }}", "True"),
        ("{{ 0 <= macros.random() < 1 }}", "True"),
        ("{{ macros.uuid.UUID(int=1) }}", str(uuid.UUID(int=1))),
        ("{{ macros.dateutil.relativedelta.relativedelta(months=1).months }}", "1"),
    ],
)
def test_macros_are_airflows(template: str, expected: str) -> None:
    assert rendered(template) == expected


def test_macro_functions() -> None:
    assert ds_add("2015-01-01", 5) == "2015-01-06"
    assert ds_add("2015-01-06", -5) == "2015-01-01"
    assert ds_add("2015-01-06", 0) == "2015-01-06"
    assert ds_format("1980-02-10", "%Y-%m-%d", "%m-%d-%y") == "02-10-80"
    assert MACROS.datetime is datetime and MACROS.timedelta is timedelta
    moved = MACROS.datetime_diff_for_humans(LOGICAL, LOGICAL + timedelta(days=2))
    assert moved == "2 days before"


def test_results_and_asset_events_are_reachable() -> None:
    with DAG("tpl", schedule=None, auto_register=False):
        op = Templated(task_id="t", text="{{ ti.xcom_pull(task_ids='up')['n'] }}", inlets=[])
    raw = {
        "xcoms": {"up": {"return_value": serialize_value({"n": 41})}},
        "triggering_asset_events": {"orders": [{"id": 7, "extra": {"rows": 3}}]},
    }
    render_template_fields(op, context_for(op, **raw))
    assert op.text == "41"
    op.text = "{{ triggering_asset_events['orders'][0].extra.rows }} {{ inlet_events | length }}"
    render_template_fields(op, context_for(op, **raw))
    assert op.text == "3 0"


def test_a_run_without_a_logical_date_has_no_ds_in_templates() -> None:
    assert rendered("{{ data_interval_start }}", logical_date=None) == "None"
    names = template_context(hydrate_context(raw_context("t", logical_date=None), _any_task()))
    assert not {"ds", "ts", "logical_date", "ds_nodash"} & set(names)
    with pytest.raises(TemplateRenderError) as caught:
        rendered("{{ ds }}", logical_date=None)
    assert str(caught.value) == (
        "task 't': template field 'text': 'ds' is undefined (this run has no logical date, "
        "so its templates have no ds, ts, logical_date)"
    )


def _any_task() -> BaseOperator:
    with DAG("tpl", schedule=None, auto_register=False):
        return Templated(task_id="t")


# --- values -----------------------------------------------------------------------------------

Pair = namedtuple("Pair", "left right")


class Nested:
    template_fields = ("query",)

    def __init__(self, query: str) -> None:
        self.query = query


def test_strings_inside_containers_are_rendered_and_other_values_kept() -> None:
    marker = object()
    nested = Nested("day {{ ds }}")
    with DAG("tpl", schedule=None, auto_register=False, params={"x": 5}):
        op = Templated(
            task_id="t",
            items={
                "list": ["{{ ds }}", 1, None, marker],
                "tuple": ("{{ params.x }}", 2.5),
                "set": {"{{ ds_nodash }}"},
                "pair": Pair("{{ run_id }}", "b"),
                "deep": {"k": [{"{{ not_a_key }}": "{{ ds }}"}]},
                "nested": nested,
            },
        )
    render_template_fields(op, context_for(op))
    items = op.items
    assert items["list"] == ["2026-03-08", 1, None, marker]
    assert items["tuple"] == ("5", 2.5)
    assert items["set"] == {"20260308"}
    assert items["pair"] == Pair("scheduled__2026-03-08", "b")
    assert items["deep"] == {"k": [{"{{ not_a_key }}": "2026-03-08"}]}  # keys are not templates
    assert items["nested"] is nested and nested.query == "day 2026-03-08"


def test_a_result_or_a_dag_param_in_a_template_field_becomes_its_value() -> None:
    @dag(schedule=None, auto_register=False)
    def flow(limit: int = 3) -> None:
        @task
        def up() -> list[int]:
            return [1]

        Templated(
            task_id="t", text=up().output, items={"limit": limit, "ref": "{{ params.limit }}"}
        )

    op = flow().get_task("t")
    # as in Airflow, a result in a custom operator's template field makes its task upstream
    assert op.upstream_task_ids == {"up"}
    context = context_for(op, xcoms={"up": {"return_value": serialize_value(["{{ ds }}"])}})
    render_template_fields(op, context)
    assert op.text == ["{{ ds }}"]  # a result is a value, never rendered
    assert op.items == {"limit": 3, "ref": "3"}


def test_render_template_renders_one_value() -> None:
    context = {"ds": "2026-01-01", "logical_date": LOGICAL, "items": [1, 2]}
    assert render_template(["{{ ds }}", {"n": "{{ items | sum }}"}], context) == [
        "2026-01-01",
        {"n": "3"},
    ]


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "echo {{ nope }}",
            "task 't': template field 'text': 'nope' is undefined (templates see the task "
            "context: ds, ts, params, ti, dag_run, macros ...)",
        ),
        ("{{ params.missing }}", "'missing'"),
        ("{{ macros.nope(ds) }}", "'nope'"),
        ("{{ ds", "task 't': template field 'text': syntax error on line 1: "),
        ("{% if %}", "syntax error on line 1"),
        ("{{ ti.__class__ }}", "access to attribute '__class__'"),
    ],
)
def test_an_undefined_name_or_bad_syntax_names_the_task_and_field(
    template: str, message: str
) -> None:
    with pytest.raises(TemplateRenderError) as caught:
        rendered(template)
    assert message in str(caught.value)
    assert "task 't': template field 'text'" in str(caught.value)


def test_an_error_raised_inside_a_template_names_the_field_in_a_note() -> None:
    with pytest.raises(TypeError) as caught:
        rendered("{{ ti.xcom_pull(task_ids=[1]) }}")
    assert caught.value.__notes__ == ["while rendering task 't': template field 'text'"]


def test_a_template_field_that_is_not_an_attribute_is_an_error() -> None:
    class Broken(Templated):
        template_fields = ("text", "missing")

    with DAG("tpl", schedule=None, auto_register=False):
        op = Broken(task_id="t")
    with pytest.raises(TemplateRenderError, match=r"template field 'missing' is not an attr"):
        render_template_fields(op, context_for(op))


def test_a_lone_str_template_fields_is_one_name() -> None:
    class One(Templated):
        template_fields = "text"  # type: ignore[assignment]  # a common slip, read as Airflow

    with DAG("tpl", schedule=None, auto_register=False):
        op = One(task_id="t", text="{{ ds }}", items=["{{ ds }}"])
    render_template_fields(op, context_for(op))
    assert (op.text, op.items) == ("2026-03-08", ["{{ ds }}"])


# --- PythonOperator ------------------------------------------------------------------------------


def test_python_operator_renders_op_args_op_kwargs_and_templates_dict() -> None:
    def report(day, limit, templates_dict, ds):
        return [day, limit, templates_dict, ds]

    with DAG("tpl", schedule=None, auto_register=False, params={"x": 5}):
        op = PythonOperator(
            task_id="t",
            python_callable=report,
            op_args=["{{ ds }}"],
            op_kwargs={"limit": "{{ params.x }}"},
            templates_dict={"query": "select {{ params.x }}"},
        )
    assert op.template_fields == ("templates_dict", "op_args", "op_kwargs")
    context = context_for(op)
    render_template_fields(op, context)
    assert op.execute(context) == ["2026-03-08", "5", {"query": "select 5"}, "2026-03-08"]
    assert context["templates_dict"] == {"query": "select 5"}


def test_a_task_without_templates_dict_gets_none() -> None:
    @task
    def report(templates_dict):
        return templates_dict

    with DAG("tpl", schedule=None, auto_register=False):
        op = report()
    context = context_for(op)
    render_template_fields(op, context)
    assert op.execute(context) is None


# --- through the task runner ---------------------------------------------------------------------

DAG_FILE = """
from engine import DAG, PythonOperator, task

with DAG("files", schedule=None, params={"table": "orders"}):
    PythonOperator(
        task_id="from_file",
        python_callable=lambda templates_dict: templates_dict["query"],
        templates_dict={"query": "sql/count.sql"},
        templates_exts=[".sql"],
    )
    PythonOperator(
        task_id="missing_file",
        python_callable=lambda templates_dict: templates_dict,
        templates_dict={"query": "sql/nope.sql"},
        templates_exts=[".sql"],
    )
    PythonOperator(
        task_id="not_a_file",
        python_callable=lambda templates_dict: templates_dict["query"],
        templates_dict={"query": "sql/count.sql "},
        templates_exts=[".sql"],
    )

    @task
    def undefined(value):
        return value

    undefined("{{ params.nope }}")
"""


@pytest.fixture
def spec_for(tmp_path: Path):
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "count.sql").write_text("select count(*) from {{ params.table }}\n")
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


def test_a_template_file_is_read_next_to_the_dag_file(spec_for) -> None:
    result = run_task(spec_for("from_file"))
    assert result.outcome == TaskState.SUCCESS, result.error
    assert deserialize_value(result.return_value) == "select count(*) from orders"


def test_a_value_ending_with_a_space_is_not_a_file(spec_for) -> None:
    result = run_task(spec_for("not_a_file"))
    assert deserialize_value(result.return_value) == "sql/count.sql "


def test_a_missing_template_file_fails_the_try(spec_for) -> None:
    result = run_task(spec_for("missing_file"))
    assert result.outcome == TaskState.FAILED
    assert result.error is not None
    assert result.error.startswith(
        "TemplateRenderError: task 'missing_file': template field 'templates_dict': template "
        "file 'sql/nope.sql' not found next to the DAG file"
    )


def test_an_undefined_name_fails_the_try_before_the_task_runs(spec_for) -> None:
    result = run_task(spec_for("undefined"))
    assert result.outcome == TaskState.FAILED and not result.no_retry
    assert result.error == (
        "TemplateRenderError: task 'undefined': template field 'op_args': 'dict object' has "
        "no attribute 'nope' (templates see the task context: ds, ts, params, ti, dag_run, "
        "macros ...)"
    )
    assert json.loads(json.dumps(result.xcoms)) == {}
