"""The DAG's template options (Airflow's ``DAG.get_template_env``): native rendering,
``user_defined_macros`` / ``_filters``, ``template_searchpath``, ``template_undefined`` and
``jinja_environment_kwargs``, and their checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jinja2
import pytest

from engine import DAG
from engine.authoring.dag import take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.execution.templates import TemplateRenderError, render_template_fields
from tests.unit.authoring.test_templates import Templated, context_for

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def render(text: Any, *, conf: dict[str, Any] | None = None, **dag_kwargs: Any) -> Any:
    with DAG("tpl", schedule=None, auto_register=False, **dag_kwargs):
        op = Templated(task_id="t", text=text)
    context = context_for(op)
    context["dag_run"].conf.update(conf or {})
    render_template_fields(op, context)
    return op.text


def test_native_rendering_gives_the_conf_list_itself() -> None:
    conf = {"ids": [1, 2, 3], "limit": 5}
    assert render("{{ dag_run.conf['ids'] }}", conf=conf, render_template_as_native_obj=True) == [
        1,
        2,
        3,
    ]
    assert (
        render("{{ dag_run.conf['limit'] + 1 }}", conf=conf, render_template_as_native_obj=True)
        == 6
    )
    assert render("{{ dag_run.conf['ids'] }}", conf=conf) == "[1, 2, 3]"


def test_native_rendering_keeps_text_around_expressions_a_string() -> None:
    assert render("ids: {{ [1, 2] }}", render_template_as_native_obj=True) == "ids: [1, 2]"
    assert render(["{{ 1 + 1 }}", "plain"], render_template_as_native_obj=True) == [2, "plain"]


def test_native_rendering_stays_sandboxed() -> None:
    with pytest.raises(TemplateRenderError):
        render("{{ ''.__class__.__mro__ }}", render_template_as_native_obj=True)


def test_user_defined_macros_and_filters() -> None:
    macros = {"project": "acme", "double": lambda n: n * 2}
    filters = {"shout": lambda text: text.upper() + "!"}
    text = "{{ project | shout }} {{ double(21) }} {{ ds }}"
    assert render(text, user_defined_macros=macros, user_defined_filters=filters) == (
        "ACME! 42 2026-03-08"
    )


def test_context_names_win_over_macros() -> None:
    assert render("{{ ds }}", user_defined_macros={"ds": "mine"}) == "2026-03-08"


def test_template_undefined_and_environment_kwargs() -> None:
    assert render("[{{ nope }}]", template_undefined=jinja2.Undefined) == "[]"
    text = "<< ds >>"
    options = {"variable_start_string": "<<", "variable_end_string": ">>"}
    assert render(text, jinja_environment_kwargs=options) == "2026-03-08"


def test_template_files_come_from_the_searchpath(tmp_path: Path) -> None:
    (tmp_path / "q.sql").write_text("select * from t where day = '{{ ds }}'")
    with DAG("tpl", schedule=None, auto_register=False, template_searchpath=str(tmp_path)):
        op = Templated(task_id="t", text="q.sql")
    op.template_ext = (".sql",)
    render_template_fields(op, context_for(op))
    assert op.text == "select * from t where day = '2026-03-08'"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"template_searchpath": 3}, "template_searchpath must be list or tuple"),
        ({"template_searchpath": ["/a", 1]}, "template_searchpath item must be str"),
        ({"user_defined_macros": ["x"]}, "user_defined_macros must be a dict"),
        ({"user_defined_filters": {"f": 1}}, "user_defined_filters['f'] must be callable"),
        ({"render_template_as_native_obj": "yes"}, "render_template_as_native_obj must be bool"),
        ({"template_undefined": str}, "template_undefined must be a jinja2.Undefined class"),
        ({"jinja_environment_kwargs": {1: 2}}, "jinja_environment_kwargs must be a dict"),
    ],
)
def test_bad_template_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DAG("tpl", schedule=None, auto_register=False, **kwargs)
