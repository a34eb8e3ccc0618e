"""Tokens made over the API (``POST /api/v1/tokens``) on SQLite and PostgreSQL: who may make
one that never expires, and that a token cannot mint a longer-lived one than itself."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from engine.db.models import utcnow
from tests.integration.api_support import ApiHarness, api_harness, bearer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration


@pytest.fixture
def api(migrated_db_url: str, tmp_path: Path) -> Iterator[ApiHarness]:
    harness = api_harness(migrated_db_url, tmp_path)
    yield harness
    harness.db.dispose()


def _expires(answer: object) -> datetime | None:
    body = answer.json()  # type: ignore[attr-defined]
    return None if body["expires"] is None else datetime.fromisoformat(body["expires"])


@pytest.mark.both_databases
def test_a_short_lived_token_cannot_mint_a_longer_lived_one(api: ApiHarness) -> None:
    api.user("vic", "viewer")
    caller_expiry = utcnow() + timedelta(minutes=5)
    short = bearer(api.token("vic", expires_at=caller_expiry))
    client = api.client()
    forever = client.post("/api/v1/tokens", json={"no_expiry": True}, headers=short)
    assert forever.status_code == 403, forever.text
    assert "only an admin" in forever.json()["detail"]
    for body in ({"expires_in": "30d"}, {}):
        made = client.post("/api/v1/tokens", json=body, headers=short)
        assert made.status_code == 201, made.text
        expires = _expires(made)
        assert expires is not None
        assert expires <= caller_expiry + timedelta(seconds=1)
    shorter = client.post("/api/v1/tokens", json={"expires_in": "1m"}, headers=short)
    expires = _expires(shorter)
    assert expires is not None and expires < caller_expiry - timedelta(minutes=3)


def test_a_session_gets_the_default_lifetime_but_never_an_endless_token(api: ApiHarness) -> None:
    api.user("vic", "viewer")
    client = api.client()
    csrf = api.login(client, "vic")
    headers = {"X-CSRF-Token": csrf}
    forever = client.post("/api/v1/tokens", json={"no_expiry": True}, headers=headers)
    assert forever.status_code == 403, forever.text
    made = client.post("/api/v1/tokens", json={}, headers=headers)
    assert made.status_code == 201, made.text
    expires = _expires(made)
    assert expires is not None and expires > utcnow() + timedelta(days=89)


def test_an_admin_may_make_a_token_that_never_expires(api: ApiHarness) -> None:
    api.user("root", "admin")
    root = bearer(api.token("root", expires_at=utcnow() + timedelta(minutes=5)))
    made = api.client().post("/api/v1/tokens", json={"no_expiry": True}, headers=root)
    assert made.status_code == 201, made.text
    assert _expires(made) is None


def test_an_absurd_lifetime_is_refused_not_a_crash(api: ApiHarness) -> None:
    api.user("root", "admin")
    root = bearer(api.token("root"))
    for text in ("3000000d", "99999999999999999999w", "3651d"):
        answer = api.client().post("/api/v1/tokens", json={"expires_in": text}, headers=root)
        assert answer.status_code == 422, answer.text
        assert "too long" in answer.json()["detail"]
