"""The API's security against the real application and database (SQLite and PostgreSQL):
bearer tokens, UI sessions, roles, CSRF, ``open_read``, limits and what errors say.

Operator routes proper (pause, trigger, ...) belong to the REST routers; the role and CSRF
rules they rely on are checked here through a route that depends on ``require_operator``
like they do, and a UI form action on ``ui_operator``.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import pytest
from fastapi import APIRouter, Depends, Form
from sqlalchemy import update

from engine.api.credentials import digest
from engine.api.security import (
    Principal,
    require_admin,
    require_operator,
    require_reader,
    ui_operator,
    ui_reader,
)
from engine.db.models import UiSession, utcnow
from tests.integration.api_support import PASSWORD, ApiHarness, api_harness, bearer, csrf_of

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
SECRET_IN_ERROR = "db-password-in-an-exception"


def _probe_router() -> APIRouter:
    """Routes guarded as the engine's own are: read, operate, administer, a UI page and a UI
    form action, and one that fails unexpectedly."""
    router = APIRouter()

    @router.get("/api/v1/probe")
    async def read(who: Annotated[Principal, Depends(require_reader)]) -> dict[str, Any]:
        return {"user": who.username}

    @router.post("/api/v1/probe")
    async def operate(
        who: Annotated[Principal, Depends(require_operator)], body: dict[str, int]
    ) -> dict[str, Any]:
        return {"user": who.username, "body": body}

    @router.delete("/api/v1/probe")
    async def administer(who: Annotated[Principal, Depends(require_admin)]) -> dict[str, Any]:
        return {"user": who.username}

    @router.get("/probe-page")
    async def page(who: Annotated[Principal, Depends(ui_reader)]) -> dict[str, Any]:
        return {"user": who.username}

    @router.post("/probe-action")
    async def action(
        who: Annotated[Principal, Depends(ui_operator)], value: Annotated[str, Form()]
    ) -> dict[str, Any]:
        return {"user": who.username, "value": value}

    @router.get("/api/v1/probe-crash")
    async def crash() -> None:
        raise RuntimeError(SECRET_IN_ERROR)

    return router


def _harness(db_url: str, tmp_path: Path, **settings: Any) -> Iterator[ApiHarness]:
    harness = api_harness(db_url, tmp_path, **settings)
    harness.app.include_router(_probe_router())
    yield harness
    harness.db.dispose()


@pytest.fixture
def api(migrated_db_url: str, tmp_path: Path) -> Iterator[ApiHarness]:
    yield from _harness(migrated_db_url, tmp_path, max_body_bytes=2000)


@pytest.fixture
def open_api(migrated_db_url: str, tmp_path: Path) -> Iterator[ApiHarness]:
    yield from _harness(migrated_db_url, tmp_path, open_read="true")


def _problem(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    body: dict[str, Any] = answer.json()
    assert set(body) >= {"type", "title", "status", "detail"} and body["status"] == status
    return body


# --- bearer tokens ---------------------------------------------------------------------


@pytest.mark.both_databases
def test_a_bearer_token_authenticates(api: ApiHarness) -> None:
    api.user("ann", "op")
    token = api.token("ann")
    answer = api.client().get("/api/v1/me", headers=bearer(token))
    assert answer.status_code == 200
    assert answer.json() == {"username": "ann", "role": "op", "auth": "token", "csrf_token": None}
    changed = api.client().post("/api/v1/probe", json={"n": 1}, headers=bearer(token))
    assert changed.status_code == 200  # no CSRF token needed with a bearer token
    assert changed.json() == {"user": "ann", "body": {"n": 1}}


def test_no_credentials_is_a_401_problem(api: ApiHarness) -> None:
    client = api.client()
    body = _problem(client.get("/api/v1/me"), 401)
    assert body["title"] == "Unauthorized" and "sluice tokens create" in body["detail"]
    answer = client.post("/api/v1/probe", json={"n": 1})
    assert answer.headers["www-authenticate"].startswith("Bearer")
    _problem(answer, 401)


@pytest.mark.parametrize(
    ("header", "detail"),
    [
        ("Bearer sluice_not-a-real-token", "invalid API token"),
        ("Bearer ", "must be 'Bearer <token>'"),
        ("Basic YWRtaW46cGFzc3dvcmQ=", "must be 'Bearer <token>'"),
    ],
)
def test_a_wrong_token_is_a_401(api: ApiHarness, header: str, detail: str) -> None:
    api.user("ann", "admin")
    answer = api.client().post("/api/v1/probe", json={"n": 1}, headers={"Authorization": header})
    assert detail in _problem(answer, 401)["detail"]


def test_an_expired_token_is_a_401(api: ApiHarness) -> None:
    api.user("ann", "admin")
    token = api.token("ann", expires_at=utcnow() - timedelta(seconds=1))
    answer = api.client().post("/api/v1/probe", json={"n": 1}, headers=bearer(token))
    assert "expired" in _problem(answer, 401)["detail"]


def test_a_revoked_token_is_a_401_from_then_on(api: ApiHarness) -> None:
    api.user("ann", "op")
    token, other = api.token("ann"), api.token("ann")
    client = api.client()
    listed = client.get("/api/v1/tokens", headers=bearer(token)).json()
    assert listed["total"] == 2
    revoked_id = next(t["id"] for t in listed["items"] if token.startswith(t["prefix"]))
    assert client.delete(f"/api/v1/tokens/{revoked_id}", headers=bearer(other)).status_code == 204
    answer = client.post("/api/v1/probe", json={"n": 1}, headers=bearer(token))
    assert "revoked" in _problem(answer, 401)["detail"]
    assert client.get("/api/v1/me", headers=bearer(other)).status_code == 200


def test_a_user_manages_only_its_own_tokens(api: ApiHarness) -> None:
    api.user("ann", "op")
    api.user("root", "admin")
    bob_token = api.token(api.user("bob", "viewer"))
    ann, root = bearer(api.token("ann")), bearer(api.token("root"))
    client = api.client()
    bobs = client.get("/api/v1/tokens?user=bob", headers=root).json()["items"]
    assert [t["user"] for t in bobs] == ["bob"]
    assert client.get("/api/v1/tokens?user=bob", headers=ann).status_code == 403
    _problem(client.delete(f"/api/v1/tokens/{bobs[0]['id']}", headers=ann), 404)
    forged = client.post("/api/v1/tokens", json={"user": "bob"}, headers=ann)
    _problem(forged, 403)
    assert client.get("/api/v1/me", headers=bearer(bob_token)).status_code == 200
    assert client.delete(f"/api/v1/tokens/{bobs[0]['id']}", headers=root).status_code == 204
    assert client.get("/api/v1/me", headers=bearer(bob_token)).status_code == 401


def test_a_token_made_over_the_api_works_and_is_shown_once(api: ApiHarness) -> None:
    api.user("ann", "viewer")
    client = api.client()
    made = client.post(
        "/api/v1/tokens", json={"name": "ci", "expires_in": "2h"}, headers=bearer(api.token("ann"))
    )
    assert made.status_code == 201, made.text
    new = made.json()
    assert new["user"] == "ann" and new["name"] == "ci" and new["token"].startswith("sluice_")
    assert client.get("/api/v1/me", headers=bearer(new["token"])).json()["username"] == "ann"
    listed = client.get("/api/v1/tokens", headers=bearer(new["token"])).text
    assert new["token"] not in listed and digest(new["token"]) not in listed
    bad = client.post("/api/v1/tokens", json={"expires_in": "soon"}, headers=bearer(new["token"]))
    assert "expires_in" in _problem(bad, 422)["detail"]


# --- roles ---------------------------------------------------------------------------------


def test_a_viewer_cannot_change_anything(api: ApiHarness) -> None:
    viewer = bearer(api.token(api.user("vic", "viewer")))
    client = api.client()
    assert client.get("/api/v1/probe", headers=viewer).json() == {"user": "vic"}
    body = _problem(client.post("/api/v1/probe", json={"n": 1}, headers=viewer), 403)
    assert "'viewer'" in body["detail"] and "op or admin" in body["detail"]
    _problem(client.delete("/api/v1/probe", headers=viewer), 403)


def test_an_op_operates_but_does_not_administer(api: ApiHarness) -> None:
    op = bearer(api.token(api.user("olga", "op")))
    client = api.client()
    assert client.post("/api/v1/probe", json={"n": 1}, headers=op).status_code == 200
    _problem(client.delete("/api/v1/probe", headers=op), 403)
    _problem(client.get("/api/v1/users", headers=op), 403)
    admin = bearer(api.token(api.user("ada", "admin")))
    assert client.delete("/api/v1/probe", headers=admin).status_code == 200


# --- UI sessions and CSRF ----------------------------------------------------------------


def _login(client: TestClient, username: str, password: str = PASSWORD, **extra: str) -> Any:
    form = client.get("/login")
    data = {"username": username, "password": password, "csrf_token": csrf_of(form.text)}
    return client.post("/login", data={**data, **extra})


@pytest.mark.both_databases
def test_login_sets_a_session_that_reads_the_api(api: ApiHarness) -> None:
    api.user("bob", "viewer")
    client = api.client()
    answer = _login(client, "bob", next="/x?y=1")
    assert answer.status_code == 303 and answer.headers["location"] == "/x?y=1"
    cookie = answer.headers["set-cookie"]
    assert "sluice_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Secure" not in cookie
    me = client.get("/api/v1/me").json()
    assert (me["username"], me["role"], me["auth"]) == ("bob", "viewer", "session")
    assert client.get("/probe-page").json() == {"user": "bob"}


def test_a_wrong_password_or_unknown_user_fails_alike(api: ApiHarness) -> None:
    api.user("bob", "viewer")
    client = api.client()
    for username, password in (("bob", "not the password"), ("nobody", PASSWORD)):
        answer = _login(client, username, password)
        assert answer.status_code == 401
        assert "Invalid username or password." in answer.text
        assert "sluice_session" not in client.cookies
    assert client.get("/api/v1/me").status_code == 401


def test_login_needs_the_form_token_and_stays_on_this_site(api: ApiHarness) -> None:
    api.user("bob", "viewer")
    client = api.client()
    forged = client.post("/login", data={"username": "bob", "password": PASSWORD})
    assert forged.status_code == 403  # no login-form token: another site's form
    assert _login(client, "bob", next="//evil.example/x").headers["location"] == "/"
    assert _login(api.client(), "bob", next="https://evil.example").headers["location"] == "/"


def test_cookie_secure_marks_the_session_cookie(migrated_db_url: str, tmp_path: Path) -> None:
    for harness in _harness(migrated_db_url, tmp_path, cookie_secure="true"):
        harness.user("bob", "viewer")
        # Secure cookies travel over https only (the login form's too).
        cookie = _login(harness.client("https://testserver"), "bob").headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie


def test_a_session_change_needs_the_csrf_token(api: ApiHarness) -> None:
    api.user("olga", "op")
    client = api.client()
    csrf = api.login(client, "olga")
    _problem(client.post("/api/v1/probe", json={"n": 1}), 403)
    wrong = client.post("/api/v1/probe", json={"n": 1}, headers={"X-CSRF-Token": "x" * 43})
    assert "CSRF" in _problem(wrong, 403)["detail"]
    ok = client.post("/api/v1/probe", json={"n": 1}, headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 200


def test_a_ui_form_post_needs_the_csrf_token(api: ApiHarness) -> None:
    api.user("olga", "op")
    client = api.client()
    csrf = api.login(client, "olga")
    refused = client.post("/probe-action", data={"value": "v"}, headers={"Accept": "text/html"})
    assert refused.status_code == 403 and "text/html" in refused.headers["content-type"]
    assert "CSRF" in refused.text
    done = client.post("/probe-action", data={"value": "v", "csrf_token": csrf})
    assert done.json() == {"user": "olga", "value": "v"}
    _problem(client.post("/logout"), 403)  # logout is a form post too
    assert client.get("/api/v1/me").status_code == 200


def test_a_viewer_session_cannot_use_a_ui_action(api: ApiHarness) -> None:
    api.user("vic", "viewer")
    client = api.client()
    csrf = api.login(client, "vic")
    _problem(client.post("/probe-action", data={"value": "v", "csrf_token": csrf}), 403)


def test_ui_pages_send_visitors_to_the_login_page(api: ApiHarness) -> None:
    client = api.client()
    answer = client.get("/probe-page?tab=runs")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login?next=/probe-page%3Ftab%3Druns"
    action = client.post("/probe-action", data={"value": "v"})
    assert action.status_code == 303 and action.headers["location"] == "/login?next=/"


def test_logout_ends_the_session_everywhere(api: ApiHarness) -> None:
    api.user("bob", "viewer")
    client = api.client()
    csrf = api.login(client, "bob")
    cookie = client.cookies["sluice_session"]
    out = client.post("/logout", data={"csrf_token": csrf})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    replay = api.client()
    replay.cookies.set("sluice_session", cookie)
    _problem(replay.get("/api/v1/me"), 401)


def test_a_session_serves_every_api_process_and_expires(api: ApiHarness) -> None:
    api.user("bob", "viewer")
    client = api.client()
    api.login(client, "bob")
    cookie = client.cookies["sluice_session"]
    second = api_harness(api.db.url, api.config.home.parent)  # another process, same DB
    other = second.client()
    other.cookies.set("sluice_session", cookie)
    assert other.get("/api/v1/me").json()["username"] == "bob"
    past = utcnow() - timedelta(seconds=1)
    api.db.call(lambda s: s.execute(update(UiSession).values(expires_at=past)))
    _problem(other.get("/api/v1/me"), 401)
    assert client.get("/probe-page").status_code == 303
    second.db.dispose()


def test_a_new_password_ends_the_sessions(api: ApiHarness) -> None:
    from engine.api.credentials import hash_password
    from engine.db.queries.users import set_password_hash

    api.user("bob", "viewer")
    client = api.client()
    api.login(client, "bob")
    new_hash = hash_password("another password")
    api.db.call(lambda s: set_password_hash(s, "bob", new_hash, now=utcnow()))
    _problem(client.get("/api/v1/me"), 401)
    assert _login(api.client(), "bob", "another password").status_code == 303


# --- open_read -----------------------------------------------------------------------------


def test_open_read_lets_anyone_read_but_not_change(open_api: ApiHarness) -> None:
    client = open_api.client()
    me = client.get("/api/v1/me").json()
    assert me["auth"] == "anonymous" and me["role"] == "viewer"
    assert client.get("/probe-page").json() == {"user": "anonymous"}
    _problem(client.post("/api/v1/probe", json={"n": 1}), 401)
    _problem(client.get("/api/v1/tokens"), 401)
    _problem(client.get("/api/v1/users"), 401)


def test_without_open_read_reading_needs_a_login(api: ApiHarness) -> None:
    _problem(api.client().get("/api/v1/probe"), 401)


# --- limits and error bodies ---------------------------------------------------------------


def test_an_oversized_body_is_a_413(api: ApiHarness) -> None:
    op = bearer(api.token(api.user("olga", "op")))
    client = api.client()
    big = {"n": 1, "padding": "x" * 3000}
    body = _problem(client.post("/api/v1/probe", json=big, headers=op), 413)
    assert "max_body_bytes" in body["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield b'{"n": 1, "p": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    streamed = client.post(
        "/api/v1/probe", content=chunks(), headers={**op, "Content-Type": "application/json"}
    )
    _problem(streamed, 413)


def test_malformed_or_invalid_json_is_a_422(api: ApiHarness) -> None:
    op = {**bearer(api.token(api.user("olga", "op"))), "Content-Type": "application/json"}
    client = api.client()
    body = _problem(client.post("/api/v1/probe", content=b'{"n": ', headers=op), 422)
    assert body["errors"] and body["errors"][0]["type"] == "json_invalid"
    wrong = _problem(client.post("/api/v1/probe", content=b'{"n": "hunter2"}', headers=op), 422)
    assert "body.n" in wrong["detail"]
    assert "hunter2" not in str(wrong)  # the value sent is never echoed


def test_an_unexpected_error_is_a_bare_500_and_logged(
    api: ApiHarness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="engine.api.problems"):
        answer = api.client().get("/api/v1/probe-crash")
    body = _problem(answer, 500)
    assert SECRET_IN_ERROR not in answer.text and "Traceback" not in answer.text
    assert body["detail"] == "an unexpected error occurred; the server's log has the details"
    logged = [r for r in caplog.records if getattr(r, "action", None) == "api_error"]
    assert logged and logged[0].exc_info is not None


def test_unknown_paths_are_404_problems_and_html_for_browsers(api: ApiHarness) -> None:
    client = api.client()
    _problem(client.get("/api/v1/nothing-here"), 404)
    page = client.get("/nothing-here", headers={"Accept": "text/html"})
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "404" in page.text


def test_security_headers(api: ApiHarness) -> None:
    answer = api.client().get("/api/v1/health")
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["cache-control"] == "no-store"


def test_pages_are_never_cached_static_files_may_be(api: ApiHarness) -> None:
    api.user("ann", "viewer")
    client = api.client()
    assert client.get("/login").headers["cache-control"] == "no-store"
    api.login(client, "ann")
    for path in ("/", "/dags", "/assets", "/asset-graph"):
        page = client.get(path, follow_redirects=True)
        assert page.status_code == 200, path
        assert page.headers["content-type"].startswith("text/html"), path
        assert page.headers["cache-control"] == "no-store", path
        assert "content-security-policy" in page.headers, path
    static = client.get("/static/sluice.css")
    assert static.status_code == 200 and "cache-control" not in static.headers


# --- secrets never leave -------------------------------------------------------------------


def test_no_response_holds_a_password_hash_or_token_hash(api: ApiHarness) -> None:
    api.user("ann", "admin")
    token = api.token("ann")
    client = api.client()
    api.login(client, "ann")
    texts = [
        client.get(path, headers=bearer(token)).text
        for path in ("/api/v1/me", "/api/v1/users", "/api/v1/tokens")
    ]
    texts.append(client.get("/api/v1/me").text)
    joined = "\n".join(texts)
    assert "$argon2" not in joined and digest(token) not in joined and token not in joined
    session_cookie = client.cookies["sluice_session"]
    assert session_cookie not in joined and digest(session_cookie) not in joined


# --- health ----------------------------------------------------------------------------------


def test_health_and_readiness_need_no_login(api: ApiHarness) -> None:
    client = api.client()
    assert client.get("/api/v1/health").json() == {"status": "ok"}
    ready = client.get("/api/v1/health/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["schema"] == "current"
    assert body["parts"] == dict.fromkeys(
        ("dag_processor", "scheduler", "executor", "triggerer", "api"), 0
    )


def test_readiness_is_503_on_an_old_schema(api: ApiHarness) -> None:
    from engine.db.schema import migrate

    migrate(api.db.engine, "0013")
    answer = api.client().get("/api/v1/health/ready")
    assert answer.status_code == 503
    assert answer.json()["status"] == "not ready" and "0013" in answer.json()["schema"]


def test_the_openapi_document_is_served_to_readers_only_and_no_cdn_docs(
    api: ApiHarness, open_api: ApiHarness
) -> None:
    client = api.client()
    _problem(client.get("/api/v1/openapi.json"), 401)
    for path in ("/api/v1/docs", "/docs/oauth2-redirect", "/api/v1/redoc"):
        assert client.get(path).status_code == 404, path
    assert open_api.client().get("/api/v1/openapi.json").status_code == 200  # open_read
    api.user("vic", "viewer")
    document = client.get("/api/v1/openapi.json", headers=bearer(api.token("vic"))).json()
    assert "/api/v1/health/ready" in document["paths"]
    assert "/api/v1/me" in document["paths"]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
