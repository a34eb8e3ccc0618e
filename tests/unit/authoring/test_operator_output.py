"""A task's result as another task's argument, for every operator: ``op.output``,
``op["key"]``, ``op.map(fn)`` and ``op.zip(other)`` (one definition, on ``BaseOperator``)."""

from __future__ import annotations

from typing import Any

import pytest

from engine import DAG, BaseOperator, PythonOperator, XComArg
from engine.authoring.dag import take_registered_dags
from engine.authoring.xcom import MapXComArg, ZipXComArg
from engine.execution.context import hydrate_context


class Listing(BaseOperator):
    template_fields = ("items",)

    def __init__(self, *, items: Any = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.items = items

    def execute(self, context: Any) -> Any:
        return list(self.items)


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def test_output_is_the_return_value_and_links_like_the_task() -> None:
    with DAG("d", schedule=None, auto_register=False):
        first = Listing(task_id="first")
        second = Listing(task_id="second", items=first.output)
        third = PythonOperator(task_id="third", python_callable=len, op_args=[first["rows"]])
    assert first.output == XComArg(first) and first.output.key == "return_value"
    assert first["rows"] == XComArg(first, "rows")
    assert second.upstream_task_ids == {"first"} and third.upstream_task_ids == {"first"}


def test_map_and_zip_transform_the_result_for_a_mapped_task() -> None:
    with DAG("d", schedule=None, auto_register=False) as dag:
        first = Listing(task_id="first", items=[1, 2])
        other = Listing(task_id="other", items=["a", "b"])
        doubled = first.map(lambda n: 2 * n)
        zipped = first.zip(other)
        Listing.partial(task_id="mapped").expand(items=zipped)
    assert isinstance(doubled, MapXComArg) and isinstance(zipped, ZipXComArg)
    assert dag.task_dict["mapped"].upstream_task_ids == {"first", "other"}
    results = {"first": {"return_value": [1, 2]}, "other": {"return_value": ["a", "b"]}}
    raw = {"dag_id": "d", "run_id": "r", "xcoms": results}
    context = hydrate_context(raw, dag.task_dict["mapped"])
    assert doubled.resolve(context) == [2, 4]
    assert zipped.resolve(context) == [(1, "a"), (2, "b")]
