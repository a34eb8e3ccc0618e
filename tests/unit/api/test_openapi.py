"""The OpenAPI document lists every answer of each operation (``engine.api.openapi``): the
problem statuses derived from what a route depends on and takes, all as problem JSON, and
text parameters that hold no NUL. (The fuzzer checks the served API against it:
``tests/integration/test_api_fuzz.py``.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from engine.api.app import create_app
from engine.config import load_config

if TYPE_CHECKING:
    from pathlib import Path

PROBLEM = "application/problem+json"


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    app = create_app(load_config(environ={"SLUICE_HOME": str(tmp_path)}))
    return app.openapi()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), p, op) for p, ops in document["paths"].items() for m, op in ops.items()]


def test_every_error_answer_is_problem_json(document: dict[str, Any]) -> None:
    for method, path, operation in _operations(document):
        for status, answer in operation["responses"].items():
            if status.startswith("4"):
                assert list(answer["content"]) == [PROBLEM], (method, path, status)


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("GET", "/api/v1/health", {"200"}),
        ("GET", "/api/v1/me", {"200", "401"}),
        ("GET", "/api/v1/users", {"200", "401", "403"}),
        ("GET", "/api/v1/dags", {"200", "401", "422"}),
        ("GET", "/api/v1/dags/{dag_id}", {"200", "401", "404", "422"}),
        (
            "POST",
            "/api/v1/dags/{dag_id}/runs",
            {"201", "400", "401", "403", "404", "409", "413", "422"},
        ),
        ("DELETE", "/api/v1/tokens/{token_id}", {"204", "401", "403", "404", "422"}),
        ("GET", "/api/v1/asset-events", {"200", "401", "404", "422"}),
    ],
)
def test_each_operation_lists_what_it_answers(
    document: dict[str, Any], method: str, path: str, statuses: set[str]
) -> None:
    assert set(document["paths"][path][method.lower()]["responses"]) == statuses


def test_text_parameters_and_body_fields_hold_no_nul(document: dict[str, Any]) -> None:
    listed = document["paths"]["/api/v1/dags"]["get"]["parameters"]
    search = next(p for p in listed if p["name"] == "search")["schema"]["anyOf"][0]
    assert search["pattern"] == "^[^\\u0000]*$"
    assert search["maxLength"] == 250
    emit = document["components"]["schemas"]["EmitRequest"]["properties"]
    assert emit["asset"]["pattern"] == "^[^\\u0000]*$"


def test_a_run_date_is_documented_with_its_years(document: dict[str, Any]) -> None:
    trigger = document["components"]["schemas"]["TriggerRequest"]["properties"]
    date = trigger["logical_date"]["anyOf"][0]
    assert date["format"] == "date-time"
    assert "1900 to 2199" in date["description"]
