"""Templates: a task's ``template_fields`` rendered with Jinja2 right before it runs.

Theory of operation (Airflow's, so a ported template renders the same). An operator class
names the attributes that are templates in ``template_fields`` (a tuple of attribute names)
and the file extensions in ``template_ext``. In the task process, after the context is
built and right before ``execute`` (or the method a deferred task resumes in), the task
runner calls ``render_template_fields(task, context)``: each field's value is rendered and
set back on the operator instance. A string is a Jinja2 template (one without any ``{`` is
kept exactly, trailing newline included); a string that ends with
one of ``template_ext`` (``"etl.sh"``, ``"query.sql"``) names a template file, read
relative to the DAG file's folder. Lists, tuples, sets and dict values are rendered item by
item, and an object with ``template_fields`` of its own has those rendered in place; a
task's result (``XComArg``, ``op.output``) or a ``@dag`` param becomes its value; any other
value is left as it is.

The names a template sees are the task context's (``ds``, ``ds_nodash``, ``ts``,
``logical_date``, ``data_interval_start`` / ``_end``, ``params``, ``dag_run``, ``ti``,
``run_id``, ``task``, ``dag``, ``inlet_events``, ``triggering_asset_events`` ...) plus
``macros`` (``ds_add``, ``ds_format``, ``datetime``, ``timedelta``, ``time``, ``uuid``,
``random``, ``json``, ``dateutil``, as Airflow's ``airflow.macros``) and the filters ``ds``,
``ds_nodash``, ``ts``, ``ts_nodash``, ``ts_nodash_with_tz`` (``{{ data_interval_end | ds
}}``). As in Airflow 3, a run without a logical date (asset-triggered) has no ``ds``,
``ts``, ``logical_date`` ... in its templates. Undefined names are errors
(``StrictUndefined``, Airflow's default): the try fails with ``TemplateRenderError`` naming
the task, the field and the name. The environment is Airflow's sandbox (attributes that
start with ``__`` are out of reach) with the ``do`` extension.

The DAG shapes the environment as Airflow's ``DAG.get_template_env`` does:
``user_defined_macros`` become global names of its templates (the context's names win over
them), ``user_defined_filters`` join the filters, ``template_searchpath`` folders are searched
for template files after the DAG file's folder, ``template_undefined`` replaces
``StrictUndefined`` and ``jinja_environment_kwargs`` are passed to the environment last. With
``render_template_as_native_obj=True`` a template renders to a native Python object (Jinja2's
``NativeEnvironment``: ``"{{ dag_run.conf['ids'] }}"`` gives the list itself; a template with
text around its expressions stays a string), still sandboxed.

Connections and variables (``engine.execution.accessors``): ``{{ var.value.my_key }}``,
``{{ var.json.my_key.field }}``, ``{{ var.value.get("my_key", "fallback") }}``, ``{{
conn.my_id.host }}``, ``{{ conn.get("my-id").login }}``. They are read when the template
renders (in the task's process, through the executor) and their secrets are masked in the
task log.

Jinja2 is imported when a template is rendered (the first string with a tag, or a template
file), not with this module: the task runner imports it in every task process, and most
tasks (a TaskFlow task without arguments, an asset-triggered one) render no template.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeGuard

from engine.authoring import macros
from engine.authoring.literals import LiteralValue
from engine.authoring.params import DagParam
from engine.authoring.xcom import XComArg
from engine.exceptions import AirflowException
from engine.execution.accessors import ConnectionAccessor, VariableAccessors

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import jinja2

    from engine.authoring.baseoperator import BaseOperator

__all__ = (
    "MACROS",
    "TemplateRenderError",
    "render_template",
    "render_template_fields",
    "template_context",
    "template_fields_of",
)

#: The context keys a run without a logical date does not have in its templates (Airflow 3).
LOGICAL_DATE_KEYS: Final = (
    "logical_date",
    "ds",
    "ds_nodash",
    "ts",
    "ts_nodash",
    "ts_nodash_with_tz",
)
_UNDEFINED_NAME: Final = re.compile(r"^'([^']+)' is undefined$")


class TemplateRenderError(AirflowException):
    """A template field of a task could not be rendered: an undefined name, bad syntax, a
    missing template file. The try fails (and is retried like any failure)."""


# --- macros and filters (Airflow's airflow.macros, airflow.templates.FILTERS) -------------


#: ``macros`` in templates: Airflow's ``airflow.macros`` module (``engine.authoring.macros``).
MACROS: Final = macros

FILTERS: Final = {
    "ds": lambda value: value.strftime("%Y-%m-%d"),
    "ds_nodash": lambda value: value.strftime("%Y%m%d"),
    "ts": lambda value: value.isoformat(),
    "ts_nodash": lambda value: value.strftime("%Y%m%dT%H%M%S"),
    "ts_nodash_with_tz": lambda value: value.isoformat().replace("-", "").replace(":", ""),
}


@functools.cache
def _environment_classes() -> tuple[type[jinja2.Environment], type[jinja2.Environment]]:
    """Airflow's sandbox (attributes starting with one ``_`` are reachable, ``__`` ones not),
    and the same rendering native Python objects (``render_template_as_native_obj``). Made
    on first use: they subclass Jinja2's, imported here (see the module's docstring)."""
    import jinja2.nativetypes
    import jinja2.sandbox

    class _Environment(jinja2.sandbox.SandboxedEnvironment):
        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            return not attr.startswith("__")

    class _NativeEnvironment(_Environment, jinja2.nativetypes.NativeEnvironment):
        pass

    return _Environment, _NativeEnvironment


def _is_template_error(exc: BaseException) -> TypeGuard[jinja2.TemplateError]:
    """Whether ``exc`` is one of Jinja2's (never, while nothing imported Jinja2)."""
    jinja2 = sys.modules.get("jinja2")
    return jinja2 is not None and isinstance(exc, jinja2.TemplateError)


def template_searchpath(dag: object) -> list[str]:
    """Where template files are looked for: the DAG file's folder, then the DAG's
    ``template_searchpath`` folders (Airflow's order)."""
    fileloc = getattr(dag, "fileloc", None)
    folders = [str(Path(fileloc).parent)] if fileloc else []
    folders += [str(folder) for folder in getattr(dag, "template_searchpath", None) or ()]
    return folders


def template_environment(task: BaseOperator | None) -> jinja2.Environment:
    """The Jinja2 environment of ``task``'s templates: template files from its DAG file's
    folder and ``template_searchpath``, ``StrictUndefined``, the ``do`` extension, Airflow's
    filters, and the DAG's macros, filters and environment options."""
    import jinja2

    dag = getattr(task, "dag", None)
    options: dict[str, Any] = {
        "loader": jinja2.FileSystemLoader(template_searchpath(dag)),
        "undefined": getattr(dag, "template_undefined", None) or jinja2.StrictUndefined,
        "extensions": ["jinja2.ext.do"],
        "cache_size": 0,
    }
    options.update(getattr(dag, "jinja_environment_kwargs", None) or {})
    native = bool(getattr(dag, "render_template_as_native_obj", False))
    sandbox, native_sandbox = _environment_classes()
    env = (native_sandbox if native else sandbox)(**options)
    env.filters.update(FILTERS)
    env.filters.update(getattr(dag, "user_defined_filters", None) or {})
    env.globals.update(getattr(dag, "user_defined_macros", None) or {})
    return env


def template_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """The names templates see: the context, ``macros``, ``task_instance_key_str``; without
    a logical date, no ``ds`` / ``ts`` / ``logical_date`` ... (as Airflow 3)."""
    names = dict(context)
    names.setdefault("macros", MACROS)
    names.setdefault("var", VariableAccessors())
    names.setdefault("conn", ConnectionAccessor())
    if names.get("logical_date") is None:
        for key in LOGICAL_DATE_KEYS:
            names.pop(key, None)
    elif names.get("ds_nodash") is not None:
        task = names.get("task")
        dag_id = names.get("dag_id") or getattr(getattr(task, "dag", None), "dag_id", None)
        task_id = getattr(task, "task_id", names.get("task_id"))
        names.setdefault("task_instance_key_str", f"{dag_id}__{task_id}__{names['ds_nodash']}")
    return names


def template_fields_of(owner: object, attribute: str = "template_fields") -> tuple[str, ...]:
    """``owner.template_fields`` (or ``template_ext``) as a tuple; a lone str is one name."""
    value = getattr(owner, attribute, ())
    if isinstance(value, str):
        return (value,)
    if value is None:
        return ()
    names = tuple(value)
    if not all(isinstance(name, str) for name in names):
        raise TemplateRenderError(
            f"{type(owner).__name__}.{attribute} must be a tuple of str, got {value!r}"
        )
    return names


class _Renderer:
    """Renders the values of one task's template fields (the environment made on first use)."""

    def __init__(self, task: BaseOperator | None, context: Mapping[str, Any]) -> None:
        self.task = task
        self.context = context
        self.names = template_context(context)
        self.template_ext = template_fields_of(task, "template_ext") if task else ()
        self._env: jinja2.Environment | None = None
        self._seen: set[int] = set()

    @property
    def env(self) -> jinja2.Environment:
        if self._env is None:
            self._env = template_environment(self.task)
        return self._env

    def render(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._render_text(value)
        if isinstance(value, XComArg | DagParam):  # its value, not rendered (as Airflow)
            return value.resolve(self.context)
        if isinstance(value, LiteralValue):  # literal(...): kept as it is (as Airflow)
            return value.value
        if type(value) is tuple:
            return tuple(self.render(item) for item in value)
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return type(value)(*(self.render(item) for item in value))
        if isinstance(value, list):
            return [self.render(item) for item in value]
        if isinstance(value, dict):
            return {key: self.render(item) for key, item in value.items()}
        if isinstance(value, set | frozenset):
            return type(value)(self.render(item) for item in value)
        self._render_nested(value)
        return value

    def _render_text(self, text: str) -> Any:
        if self.template_ext and text.endswith(self.template_ext):
            template = self.env.get_template(text)
        elif not self._has_tags(text):
            return text  # nothing to render
        else:
            template = self.env.from_string(text)
        return template.render(self.names)

    def _has_tags(self, text: str) -> bool:
        """Whether ``text`` holds a Jinja2 tag (every default one starts with ``{``)."""
        if not getattr(getattr(self.task, "dag", None), "jinja_environment_kwargs", None):
            return "{" in text
        env = self.env
        marks = (
            env.block_start_string,
            env.variable_start_string,
            env.comment_start_string,
            env.line_statement_prefix,
            env.line_comment_prefix,
        )
        return any(mark and mark in text for mark in marks)

    def _render_nested(self, value: object) -> None:
        """An object with ``template_fields`` of its own (not a task) has them rendered."""
        fields = getattr(value, "template_fields", None)
        if not fields or id(value) in self._seen or isinstance(value, type):
            return
        self._seen.add(id(value))
        for name in template_fields_of(value):
            setattr(value, name, self.render(getattr(value, name)))


def _explain(exc: jinja2.TemplateError, names: Mapping[str, Any]) -> str:
    import jinja2  # loaded: ``exc`` is one of its errors

    if isinstance(exc, jinja2.TemplateNotFound):
        return (
            f"template file {exc.name!r} not found next to the DAG file nor in the DAG's "
            "template_searchpath; a value that ends with one of the operator's template_ext "
            "is read as a template file relative to those folders (add a space after it to "
            "use it as it is)"
        )
    if isinstance(exc, jinja2.TemplateSyntaxError):
        where = f" (template file {exc.name!r})" if exc.name else ""
        return f"syntax error on line {exc.lineno}{where}: {exc.message}"
    text = str(exc.message or type(exc).__name__)
    match = _UNDEFINED_NAME.match(text)
    if match and match.group(1) in LOGICAL_DATE_KEYS and "logical_date" not in names:
        text += " (this run has no logical date, so its templates have no ds, ts, logical_date)"
    elif isinstance(exc, jinja2.UndefinedError):
        text += " (templates see the task context: ds, ts, params, ti, dag_run, macros ...)"
    return text


def render_template(
    value: Any,
    context: Mapping[str, Any],
    *,
    task: BaseOperator | None = None,
    template_ext: Iterable[str] = (),
) -> Any:
    """``value`` rendered with ``context`` (strings inside lists, tuples, sets and dict
    values too); a string ending with one of ``template_ext`` is a template file's name.
    Raises Jinja2's errors (``render_template_fields`` turns them into a failure)."""
    renderer = _Renderer(task, context)
    renderer.template_ext = tuple(template_ext)
    return renderer.render(value)


def render_field(renderer: _Renderer, owner: Any, name: str) -> None:
    """Render ``owner.<name>`` and set the result back; errors name the task and field."""
    task_id = getattr(renderer.task, "task_id", None)
    where = f"task {task_id!r}: template field {name!r}"
    try:
        value = getattr(owner, name)
    except AttributeError:
        raise TemplateRenderError(
            f"{where} is not an attribute of {type(owner).__name__}; set self.{name} in its "
            "__init__ or remove it from template_fields"
        ) from None
    try:
        rendered = renderer.render(value)
    except Exception as exc:
        if _is_template_error(exc):
            raise TemplateRenderError(f"{where}: {_explain(exc, renderer.names)}") from exc
        exc.add_note(f"while rendering {where}")
        raise
    setattr(owner, name, rendered)


def render_template_fields(task: BaseOperator, context: Mapping[str, Any]) -> None:
    """Render every ``template_fields`` attribute of ``task`` in place, with ``context``.

    ``TemplateRenderError`` names the task, the field and what went wrong (an undefined
    name, bad syntax, a missing template file).
    """
    fields = template_fields_of(task)
    if not fields:
        return
    renderer = _Renderer(task, context)
    for name in fields:
        render_field(renderer, task, name)
