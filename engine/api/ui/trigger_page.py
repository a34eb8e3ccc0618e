"""Triggering a DAG from the UI (op and admin, CSRF-checked): a form generated from the
DAG's ``Param``s (``params_form``), then a confirmation page showing the conf the run
will get, then the run.

``POST /dags/{dag_id}/trigger`` takes either the params form (``form=params``: one field
per param and a ``conf`` textarea for other keys) or a bare ``conf`` (the DAG list's quick
trigger). Any problem re-renders the form (422) with each param's problem next to its
field and what was typed kept. A valid conf gets the confirmation page unless the post
says ``confirmed``; ``edit`` goes back to the form filled from the conf. The run is made
by ``engine.views.operations.trigger_dag``, which checks the conf against the params once
more, as the REST API and the CLI do.
"""

import json
from functools import partial
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData

from engine.api.deps import DatabaseDep
from engine.api.security import UiOperatorDep
from engine.api.ui import params_form
from engine.api.ui.rendering import json_object_field, not_found, page, run_url
from engine.db.models import utcnow
from engine.exceptions import NotFoundError, OperatorActionError
from engine.views import dag_docs, operations

#: The most of a form field read (a conf or one param's text).
MAX_FIELD_CHARS: Final = 65_536
_CONF: Final = "conf"

router = APIRouter(include_in_schema=False)


async def _params(database: DatabaseDep, dag_id: str) -> dict[str, Any]:
    found = await database.read(partial(dag_docs.trigger_params, dag_id=dag_id))
    if found is None:
        raise not_found(f"no DAG {dag_id!r}; the DAG list shows the DAGs")
    return found["params"]


def _form_page(
    request: Request,
    dag_id: str,
    specs: dict[str, Any],
    *,
    fields: list[params_form.ParamField],
    conf_text: str,
    problems: dict[str, str] | None = None,
    status_code: int = 200,
    problem: str | None = None,
) -> HTMLResponse:
    return page(
        request,
        "trigger.html",
        "/dags",
        dag_id=dag_id,
        fields=fields,
        conf_text=conf_text,
        conf_problem=(problems or {}).get(_CONF),
        problem=problem,
        has_params=bool(specs),
        status_code=status_code,
    )


@router.get("/dags/{dag_id}/trigger", response_class=HTMLResponse)
async def trigger_form(
    request: Request, dag_id: str, _principal: UiOperatorDep, database: DatabaseDep
) -> HTMLResponse:
    specs = await _params(database, dag_id)
    return _form_page(request, dag_id, specs, fields=params_form.fields(specs), conf_text="")


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value[:MAX_FIELD_CHARS] if isinstance(value, str) else ""


def _extra_text(conf: dict[str, Any], specs: dict[str, Any]) -> str:
    """The conf's keys that are no param, as the form's ``conf`` textarea shows them."""
    extra = {k: v for k, v in conf.items() if k not in specs}
    return json.dumps(extra, indent=2) if extra else ""


def _read(
    specs: dict[str, Any], form: FormData
) -> tuple[dict[str, Any], dict[str, str], dict[str, str] | None]:
    """The conf a post asks for, the problems by field, and the texts typed (None: a bare
    conf was posted)."""
    fields = {key: _text(form, key) for key in form if key.startswith(params_form.FIELD_PREFIX)}
    problems: dict[str, str] = {}
    try:
        extra = json_object_field(_text(form, _CONF), _CONF) or {}
    except ValueError as exc:
        extra, problems[_CONF] = {}, str(exc)
    if _text(form, "form") != params_form.FORM_MARK:
        return extra, {**problems, **params_form.check_conf(specs, extra)}, None
    values, field_problems, texts = params_form.read_form(specs, fields)
    named = sorted(set(extra) & set(specs))
    if named:
        problems[_CONF] = f"set {', '.join(named)} in {'its' if len(named) == 1 else 'their'} field"
    return {**extra, **values}, {**problems, **field_problems}, texts


@router.post("/dags/{dag_id}/trigger", response_model=None)
async def trigger(
    request: Request, dag_id: str, _principal: UiOperatorDep, database: DatabaseDep
) -> Response:
    """The form again with problems (422), the confirmation page, or (``confirmed``) a
    manual run now and then its page."""
    specs = await _params(database, dag_id)
    form = await request.form()  # read (and cached) by the CSRF check already
    conf, problems, texts = _read(specs, form)
    if problems or _text(form, "edit"):
        typed = texts is not None or _CONF in problems  # keep what was typed in the textarea
        return _form_page(
            request,
            dag_id,
            specs,
            fields=params_form.fields(specs, values=conf, texts=texts, errors=problems),
            conf_text=_text(form, _CONF) if typed else _extra_text(conf, specs),
            problems=problems,
            status_code=422 if problems else 200,
            problem="No run was created: fix the fields marked below." if problems else None,
        )
    if not _text(form, "confirmed"):
        return page(
            request,
            "trigger_confirm.html",
            "/dags",
            dag_id=dag_id,
            conf=conf,
            conf_json=json.dumps(conf),
            conf_shown=json.dumps(conf, indent=2, ensure_ascii=False),
        )
    return await _create(request, database, dag_id, specs, conf)


async def _create(
    request: Request, database: DatabaseDep, dag_id: str, specs: dict[str, Any], conf: Any
) -> Response:
    try:
        made = await database.run(
            partial(
                operations.trigger_dag,
                dag_id=dag_id,
                conf=conf or None,
                logical_date=None,
                now=utcnow(),
            )
        )
    except NotFoundError as exc:
        raise not_found(str(exc)) from exc
    except (ValueError, OperatorActionError) as exc:  # a run at that date already, say
        fields = params_form.fields(specs, values=conf)
        return _form_page(
            request,
            dag_id,
            specs,
            fields=fields,
            conf_text=_extra_text(conf, specs),
            status_code=422,
            problem=str(exc),
        )
    return RedirectResponse(run_url(dag_id, made["run_id"]), status_code=303)
