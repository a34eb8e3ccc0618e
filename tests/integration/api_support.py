"""What API tests share: the real application on a migrated database (SQLite or PostgreSQL),
in process through FastAPI's TestClient, and users, tokens and logins made the real way.

``api_harness(db_url, tmp_path, **settings)`` returns an ``ApiHarness`` on a database already
at head (the ``migrated_db_url`` fixture: a copy of the session's template); ``settings`` are
``[api]`` keys (``open_read="true"``...). ``harness.user(name, role)`` adds a user (password
``PASSWORD``), ``harness.token(name)`` makes a token for it, ``harness.login(client, name)``
logs a TestClient in through ``/login`` and returns the session's CSRF token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from fastapi.testclient import TestClient

from engine.api import credentials
from engine.api.app import create_app
from engine.config import Config, load_config
from engine.db.database import Database
from engine.db.models import utcnow
from engine.db.queries import users as users_sql

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime
    from pathlib import Path

    from fastapi import FastAPI

PASSWORD = "correct horse battery"
_CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass
class ApiHarness:
    db: Database
    config: Config
    app: FastAPI

    def client(self, base_url: str = "http://testserver") -> TestClient:
        """A new client (its own cookies); errors are answered, not raised."""
        return TestClient(
            self.app, base_url=base_url, raise_server_exceptions=False, follow_redirects=False
        )

    def user(self, username: str, role: str = credentials.ADMIN) -> str:
        add = partial(
            users_sql.add_user,
            username=username,
            role=role,
            password_hash=credentials.hash_password(PASSWORD),
            now=utcnow(),
        )
        self.db.call(add)
        return username

    def token(self, username: str, *, expires_at: datetime | None = None) -> str:
        token = credentials.new_token()
        add = partial(
            users_sql.add_token,
            username=username,
            token_hash=credentials.digest(token),
            prefix=credentials.shown_prefix(token),
            name="test",
            expires_at=expires_at,
            now=utcnow(),
        )
        self.db.call(add)
        return token

    def login(self, client: TestClient, username: str, password: str = PASSWORD) -> str:
        """Log ``client`` in through the login form; the session's CSRF token."""
        form = client.get("/login")
        assert form.status_code == 200, form.text
        answer = client.post(
            "/login",
            data={"username": username, "password": password, "csrf_token": csrf_of(form.text)},
        )
        assert answer.status_code == 303, answer.text
        me = client.get("/api/v1/me")
        assert me.status_code == 200, me.text
        csrf: str = me.json()["csrf_token"]
        return csrf


def csrf_of(html: str) -> str:
    match = _CSRF_FIELD.search(html)
    assert match is not None, f"no csrf_token field in: {html[:500]}"
    return match.group(1)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def api_harness(db_url: str, tmp_path: Path, **settings: Any) -> ApiHarness:
    db = Database(db_url)
    environ = {"SLUICE_HOME": str(tmp_path / "home")}
    environ.update({f"SLUICE__API__{key.upper()}": str(value) for key, value in settings.items()})
    config = load_config(environ=environ)
    return ApiHarness(db=db, config=config, app=create_app(config, db))


def parsed_ui(url: str, root: Path, dags: Path, users: dict[str, str]) -> Iterator[ApiHarness]:
    """The application on the database at ``url`` once the DAG files of ``dags`` are parsed
    into it, with ``users`` (name -> role); its database disposed of at the end."""
    from tests.integration.harness import parsed_database

    parsed_database(url, root, dags).db.dispose()
    api = api_harness(url, root)
    for name, role in users.items():
        api.user(name, role)
    try:
        yield api
    finally:
        api.db.dispose()
