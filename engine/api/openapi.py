"""The OpenAPI document of the REST API, with every answer an operation can give.

FastAPI documents an operation's success and, when it has parameters, a 422 with its own
``application/json`` validation schema. The API answers more than that, every error as
``application/problem+json`` (``engine.api.problems``), and a client (or a fuzzer checking
the API against its document) must find each one. The statuses are derived from what each
route depends on and takes, so a new route is documented without listing them by hand:

- 401: it needs a caller (``require_reader`` and stronger);
- 403: it needs a role (``require_user``, ``require_operator``, ``require_admin``): a role
  too low, or a session's request without its CSRF token;
- 400, 413: it takes a body (JSON that does not parse; a body over ``[api] max_body_bytes``);
- 404: it names something (a path parameter) or takes a body naming something;
- 409: it acts on the engine's state (a POST outside ``/tokens``);
- 422: any parameter or body it takes fails validation (or, for some, the action is refused).

Statuses a route declares itself (``responses=``) keep their description. Text parameters
and the text fields of request bodies say they hold no NUL character (a 422:
``problems.RefuseNul``, ``rest.common.RequestBody``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from fastapi import routing
from fastapi.openapi.utils import get_openapi

from engine.api import security
from engine.api.problems import PROBLEM_JSON

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fastapi import FastAPI
    from fastapi.dependencies.models import Dependant

_DESCRIPTIONS: Final = {
    400: "The body is not valid JSON",
    401: "No valid credentials: log in, or send 'Authorization: Bearer <token>'",
    403: "The caller's role does not allow this (or a session's CSRF token is missing)",
    404: "Something the request names does not exist",
    409: "The action does not apply to the current state",
    413: "The request body is larger than [api] max_body_bytes",
    422: "A parameter or the body is not valid, or the action is refused (detail says why)",
}
_ROLE_DEPENDENCIES: Final = (
    security.require_user,
    security.require_operator,
    security.require_admin,
)
_PROBLEM_SCHEMA: Final = {
    "title": "Problem",
    "description": "An error (RFC 9457); a validation error adds `errors`",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                    "msg": {"type": "string"},
                    "type": {"type": ["string", "null"]},
                },
            },
        },
    },
}
_PROBLEM_REF: Final = {"$ref": "#/components/schemas/Problem"}
_NO_NUL: Final = "^[^\\u0000]*$"


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` build (once) the document with every answer documented."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            document_problems(schema, app.routes)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def document_problems(schema: dict[str, Any], routes: list[Any]) -> None:
    """Add to each operation of ``schema`` the problem answers its route can give."""
    schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = _PROBLEM_SCHEMA
    paths = schema.get("paths", {})
    _no_nul_in_text(schema)
    for route in routing.iter_route_contexts(routes):  # the routes of included routers too
        if not isinstance(route.original_route, routing.APIRoute) or not route.include_in_schema:
            continue
        for method in route.methods or ():
            operation = paths.get(route.path_format, {}).get(method.lower())
            if operation is not None:
                _add_problems(operation, problem_statuses(route, method))


def problem_statuses(route: Any, method: str) -> set[int]:
    """The error statuses ``route`` can answer to ``method`` (see the module docstring)."""
    calls = {dependency.call for dependency in _dependencies(route.dependant)}
    statuses: set[int] = set()
    if security.require_reader in calls or calls.intersection(_ROLE_DEPENDENCIES):
        statuses.add(401)
    if calls.intersection(_ROLE_DEPENDENCIES):
        statuses.add(403)
    has_body = route.body_field is not None
    if has_body:
        statuses |= {400, 413}
    if route.dependant.path_params or has_body:
        statuses.add(404)
    if method == "POST" and not route.path_format.endswith("/tokens"):
        statuses.add(409)
    if _has_parameters(route.dependant) or has_body:
        statuses.add(422)
    return statuses


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dependency in dependant.dependencies:
        yield dependency
        yield from _dependencies(dependency)


def _has_parameters(dependant: Dependant) -> bool:
    own = dependant.path_params or dependant.query_params or dependant.header_params
    return bool(own) or any(_has_parameters(d) for d in dependant.dependencies)


def _add_problems(operation: dict[str, Any], statuses: set[int]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for status in sorted(statuses):
        entry = responses.setdefault(str(status), {"description": _DESCRIPTIONS[status]})
        entry["content"] = {PROBLEM_JSON: {"schema": _PROBLEM_REF}}
    for code, entry in responses.items():  # a 4xx a route declares itself is problem JSON too
        if code.startswith("4"):
            entry["content"] = {PROBLEM_JSON: {"schema": _PROBLEM_REF}}


def _no_nul_in_text(schema: dict[str, Any]) -> None:
    """Add the no-NUL pattern to every text parameter and request body text field."""
    bodies: set[str] = set()
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                _no_nul(parameter.get("schema", {}))
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                bodies.update(_refs(media.get("schema", {})))
    components = schema.get("components", {}).get("schemas", {})
    for name in bodies:
        for field in components.get(name, {}).get("properties", {}).values():
            _no_nul(field)


def _refs(node: dict[str, Any]) -> Iterator[str]:
    if "$ref" in node:
        yield node["$ref"].rsplit("/", 1)[-1]
    for option in node.get("anyOf", ()):
        yield from _refs(option)


def _no_nul(node: dict[str, Any]) -> None:
    if node.get("type") == "string" and "pattern" not in node and "enum" not in node:
        node["pattern"] = _NO_NUL
    for option in node.get("anyOf", ()):
        _no_nul(option)
