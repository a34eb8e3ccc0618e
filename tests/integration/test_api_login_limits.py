"""Failed UI logins on SQLite and PostgreSQL: after 5 failures for a username or from one
client, attempts are refused with 429 and Retry-After for a delay that grows; a fake clock
stands in for the time that passes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from engine.api.login_guard import BASE_DELAY_S, MAX_FAILURES, LoginGuard
from tests.integration.api_support import PASSWORD, ApiHarness, api_harness, csrf_of

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(migrated_db_url: str, tmp_path: Path) -> Iterator[tuple[ApiHarness, FakeClock]]:
    harness = api_harness(migrated_db_url, tmp_path)
    clock = FakeClock()
    harness.app.state.login_guard = LoginGuard(clock=clock)
    yield harness, clock
    harness.db.dispose()


def _login(client: TestClient, username: str, password: str) -> Any:
    form = client.get("/login")
    return client.post(
        "/login",
        data={"username": username, "password": password, "csrf_token": csrf_of(form.text)},
    )


@pytest.mark.both_databases
def test_repeated_failures_for_a_user_are_refused_for_a_growing_delay(
    api: tuple[ApiHarness, FakeClock],
) -> None:
    harness, clock = api
    harness.user("ann", "viewer")
    client = harness.client()
    for _ in range(MAX_FAILURES):
        assert _login(client, "ann", "wrong password").status_code == 401
    refused = _login(client, "ann", PASSWORD)  # even the right password: nothing is checked
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) == BASE_DELAY_S + 1
    assert "Too many failed logins" in refused.text
    clock.now += BASE_DELAY_S + 1
    assert _login(client, "ann", "wrong again").status_code == 401
    again = _login(client, "ann", PASSWORD)
    assert again.status_code == 429 and int(again.headers["Retry-After"]) == 2 * BASE_DELAY_S + 1
    clock.now += 2 * BASE_DELAY_S + 1
    assert _login(client, "ann", PASSWORD).status_code == 303
    assert client.get("/api/v1/me").json()["username"] == "ann"


def test_failures_from_one_client_over_many_usernames_are_refused(
    api: tuple[ApiHarness, FakeClock],
) -> None:
    harness, clock = api
    harness.user("bob", "viewer")
    client = harness.client()
    for index in range(MAX_FAILURES):
        assert _login(client, f"guess{index}", "wrong password").status_code == 401
    assert _login(client, "bob", PASSWORD).status_code == 429
    clock.now += BASE_DELAY_S + 1
    assert _login(client, "bob", PASSWORD).status_code == 303


def test_failures_spread_over_more_than_the_window_do_not_lock(
    api: tuple[ApiHarness, FakeClock],
) -> None:
    harness, clock = api
    harness.user("cy", "viewer")
    client = harness.client()
    for _ in range(2 * MAX_FAILURES):
        assert _login(client, "cy", "wrong password").status_code == 401
        clock.now += 100.0  # 5 failures take 400 s: never 5 within 300 s
    assert _login(client, "cy", PASSWORD).status_code == 303


# --- behind a proxy: [api] trusted_proxies --------------------------------------------------


def _proxied(migrated_db_url: str, tmp_path: Path, **settings: Any) -> tuple[ApiHarness, Any]:
    harness = api_harness(migrated_db_url, tmp_path, **settings)
    harness.app.state.login_guard = LoginGuard(clock=FakeClock())
    return harness, harness.user("ann", "viewer")


def _client_at(harness: ApiHarness, peer: str) -> TestClient:
    from fastapi.testclient import TestClient

    return TestClient(
        harness.app, client=(peer, 40000), raise_server_exceptions=False, follow_redirects=False
    )


def _login_from(client: TestClient, username: str, forwarded_for: str) -> Any:
    form = client.get("/login")
    return client.post(
        "/login",
        data={"username": username, "password": "wrong", "csrf_token": csrf_of(form.text)},
        headers={"X-Forwarded-For": forwarded_for},
    )


def test_a_rotating_forwarded_for_from_an_unlisted_peer_never_resets_the_throttle(
    migrated_db_url: str, tmp_path: Path
) -> None:
    """The peer is not a trusted proxy: each try names a new X-Forwarded-For address and a
    new username, yet the peer's address is what is counted and refused."""
    harness, _ = _proxied(migrated_db_url, tmp_path, trusted_proxies="10.0.0.1")
    client = _client_at(harness, "203.0.113.9")
    for attempt in range(MAX_FAILURES):
        answer = _login_from(client, f"user{attempt}", f"198.51.100.{attempt}")
        assert answer.status_code == 401, answer.text
    for attempt in range(MAX_FAILURES, MAX_FAILURES + 5):
        refused = _login_from(client, f"user{attempt}", f"198.51.100.{attempt}")
        assert refused.status_code == 429, refused.text
    harness.db.dispose()


def test_a_listed_proxy_has_its_forwarded_client_throttled_not_itself(
    migrated_db_url: str, tmp_path: Path
) -> None:
    """Through a trusted proxy, the client it names is throttled; another client behind the
    same proxy may still log in, and the proxy's own address is never counted."""
    harness, _ = _proxied(migrated_db_url, tmp_path, trusted_proxies="10.0.0.0/24")
    proxy = _client_at(harness, "10.0.0.1")
    for attempt in range(MAX_FAILURES):
        assert _login_from(proxy, f"user{attempt}", "198.51.100.7").status_code == 401
    assert _login_from(proxy, "another", "198.51.100.7").status_code == 429
    other = _login_from(proxy, "another", "198.51.100.8")
    assert other.status_code == 401, other.text  # checked (a wrong password), not refused
    guard: LoginGuard = harness.app.state.login_guard
    assert guard.retry_after([("client", "198.51.100.7")]) is not None
    assert guard.retry_after([("client", "10.0.0.1")]) is None
    harness.db.dispose()
