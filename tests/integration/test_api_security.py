"""The API's security against the real application and database (SQLite and PostgreSQL):
who may read and change what, sessions, CSRF, limits and error bodies."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.integration.api_support import PASSWORD, ApiHarness, api_harness, bearer, csrf_of

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> ApiHarness:
    harness = api_harness(db_url, tmp_path)
    yield harness
    harness.db.dispose()


def test_a_bearer_token_authenticates(api: ApiHarness) -> None:
    api.user("ann", "op")
    token = api.token("ann")
    answer = api.client().get("/api/v1/me", headers=bearer(token))
    assert answer.status_code == 200
    assert answer.json() == {"username": "ann", "role": "op", "auth": "token", "csrf_token": None}


def test_login_sets_a_session_that_reads_the_api(api: ApiHarness) -> None:
    api.user("bob", "viewer")
    client = api.client()
    form = client.get("/login")
    answer = client.post(
        "/login",
        data={
            "username": "bob",
            "password": PASSWORD,
            "csrf_token": csrf_of(form.text),
            "next": "/x",
        },
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/x"
    cookie = answer.headers["set-cookie"]
    assert "sluice_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    me = client.get("/api/v1/me").json()
    assert (me["username"], me["role"], me["auth"]) == ("bob", "viewer", "session")
    assert me["csrf_token"]


def test_no_credentials_is_a_401_problem(api: ApiHarness) -> None:
    answer = api.client().get("/api/v1/me")
    assert answer.status_code == 401
    assert answer.headers["content-type"] == "application/problem+json"
    body = answer.json()
    assert body["status"] == 401 and body["title"] == "Unauthorized"
    assert "sluice tokens create" in body["detail"]
    assert answer.headers["www-authenticate"].startswith("Bearer")


def test_health_and_readiness_need_no_login(api: ApiHarness) -> None:
    client = api.client()
    assert client.get("/api/v1/health").json() == {"status": "ok"}
    ready = client.get("/api/v1/health/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["schema"] == "current"
    assert body["parts"] == {
        "dag_processor": 0,
        "scheduler": 0,
        "executor": 0,
        "triggerer": 0,
        "api": 0,
    }
