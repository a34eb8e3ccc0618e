"""``map_index_template``: an operator argument (no longer ignored), rendered for a copy of
a mapped task with its context once it ran (``engine.execution.map_index``); after a
success a template that cannot render is an error naming it (as Airflow's task runner),
after a failure it names nothing and the log says why."""

from __future__ import annotations

import logging
import re

import pytest

from engine import DAG, PythonOperator
from engine.authoring.dag import take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.execution.map_index import RENDERED_MAP_INDEX_MAX_CHARS, render_map_index
from engine.execution.templates import TemplateRenderError


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    take_registered_dags()


def _op(template: str | None) -> PythonOperator:
    with DAG("d"):
        return PythonOperator(task_id="t", python_callable=print, map_index_template=template)


def test_it_is_an_argument_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        op = _op("{{ x }}")
    assert op.map_index_template == "{{ x }}"
    assert "map_index_template" not in caplog.text


def test_a_template_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="map_index_template must be str"):
        _op(3)  # type: ignore[arg-type]


def test_a_copy_renders_its_template_with_its_context() -> None:
    op = _op("{{ region }}-{{ map_index }}")
    assert render_map_index(op, {"map_index": 2, "region": "eu"}) == "eu-2"


def test_an_unmapped_task_or_no_template_names_nothing() -> None:
    assert render_map_index(_op("{{ region }}"), {"map_index": -1, "region": "eu"}) is None
    assert render_map_index(_op(None), {"map_index": 0}) is None
    assert render_map_index(None, {"map_index": 0}) is None


def test_after_a_success_a_template_that_cannot_render_is_an_error_naming_it() -> None:
    expected = re.escape("task 't': map_index_template '{{ missing }}' did not render")
    with pytest.raises(TemplateRenderError, match=expected):
        render_map_index(_op("{{ missing }}"), {"map_index": 1}, strict=True)


def test_after_a_failure_a_broken_or_empty_template_keeps_the_number_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.execution.map_index"):
        assert render_map_index(_op("{{ missing }}"), {"map_index": 1}) is None
        assert render_map_index(_op("{{ '' }}"), {"map_index": 1}) is None
    assert "did not render (UndefinedError" in caplog.text
    assert "keeps its map index 1" in caplog.text
    assert "rendered to nothing" in caplog.text


def test_a_long_name_is_cut_to_the_stored_length() -> None:
    rendered = render_map_index(_op("{{ 'x' * 300 }}"), {"map_index": 0})
    assert rendered == "x" * RENDERED_MAP_INDEX_MAX_CHARS
