"""``op_args`` / ``op_kwargs`` given as one task result (an ``XComArg``): upstream, not
iterated at definition time, resolved (and checked) when the task runs, as Airflow does."""

from __future__ import annotations

import pytest

from engine import DAG, PythonOperator, XComArg, task
from engine.authoring.dag import take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.execution.templates import render_template_fields
from tests.unit.authoring.test_xcom import context_for


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


@task
def make_args() -> list[int]:
    return [2, 3]


def test_a_whole_result_as_op_args_and_op_kwargs() -> None:
    with DAG("flow", auto_register=False):
        args = make_args()
        settings = PythonOperator(task_id="settings", python_callable=dict)
        op = PythonOperator(
            task_id="use",
            python_callable=lambda a, b, scale=1, unit="": f"{(a + b) * scale}{unit}",
            op_args=args,
            op_kwargs=XComArg(settings),
        )
    assert op.upstream_task_ids == {"make_args", "settings"}
    assert isinstance(op.op_args, XComArg) and isinstance(op.op_kwargs, XComArg)
    results = {
        "make_args": {"return_value": [2, 3]},
        "settings": {"return_value": {"scale": 10, "unit": "kg"}},
    }
    context = context_for(op, results)
    assert op.execute(context) == "50kg"  # resolved without rendering
    render_template_fields(op, context)  # the task runner renders first
    assert op.op_args == [2, 3] and op.op_kwargs == {"scale": 10, "unit": "kg"}
    assert op.execute(context) == "50kg"


def test_an_operator_as_op_args_stands_for_its_return_value() -> None:
    with DAG("flow", auto_register=False):
        source = PythonOperator(task_id="source", python_callable=lambda: (4, 5))
        op = PythonOperator(task_id="use", python_callable=lambda a, b: a * b, op_args=source)
    assert op.upstream_task_ids == {"source"}
    assert op.execute(context_for(op, {"source": {"return_value": (4, 5)}})) == 20


def test_a_result_of_the_wrong_shape_fails_the_task_clearly() -> None:
    with DAG("flow", auto_register=False):
        source = PythonOperator(task_id="source", python_callable=lambda: 1)
        args = PythonOperator(task_id="args", python_callable=print, op_args=source.output)
        kwargs = PythonOperator(task_id="kwargs", python_callable=print, op_kwargs=source.output)
    context = context_for(args, {"source": {"return_value": 7}})
    with pytest.raises(TypeError, match="task 'args': op_args must be a list or tuple when"):
        args.execute(context)
    with pytest.raises(TypeError, match="task 'kwargs': op_kwargs must be a dict with str keys"):
        kwargs.execute(context_for(kwargs, {"source": {"return_value": [1]}}))


def test_op_args_that_are_neither_a_list_nor_a_result_are_refused() -> None:
    with DAG("flow", auto_register=False), pytest.raises(DagDefinitionError, match="op_args must"):
        PythonOperator(task_id="bad", python_callable=print, op_args=5)
