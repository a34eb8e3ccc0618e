"""The API part as an operator runs it: ``sluice users`` / ``sluice tokens``, ``sluice
api-server`` alone, and ``sluice run`` serving the UI and API at the address its readiness
line prints."""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from engine.db.database import Database
from engine.db.models import Job
from tests.cli import invoke
from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import (
    engine_env,
    log_tail,
    run_cli,
    sluice_env,
    start_cli,
    start_engine,
    stop,
    wait_ready,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

PASSWORD = "a long enough password"
URL_IN_READY_LINE = re.compile(r"Sluice ready: .*UI and API at (http://127\.0\.0\.1:\d+/)")


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, body = answer.status, answer.read()
            kind = answer.headers.get("content-type", "")
    except urllib.error.HTTPError as error:
        status, body, kind = error.code, error.read(), error.headers.get("content-type", "")
    return status, json.loads(body) if "json" in kind else body.decode()


def _ready_url(log: Path) -> str:
    match = URL_IN_READY_LINE.search(log.read_text())
    assert match is not None, log_tail(log)
    return match.group(1)


@pytest.fixture
def env(tmp_path: Path, sqlite_template: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "dags").mkdir()
    url = copy_sqlite_template(sqlite_template, home / "sluice.db")
    return engine_env(home, url=url, dags=tmp_path / "dags")


def _create_user(env: dict[str, str], username: str, role: str) -> None:
    result = _cli_input(
        env,
        f"{PASSWORD}\n",
        "users",
        "create",
        "--username",
        username,
        "--role",
        role,
        "--password-stdin",
    )
    assert result.returncode == 0, result.stderr


def _cli_input(env: dict[str, str], text: str, *args: str) -> Any:
    return invoke(*args, env=env, input=text)


def test_users_and_tokens_from_the_command_line(env: dict[str, str]) -> None:
    _create_user(env, "ada", "admin")
    again = _cli_input(
        env,
        f"{PASSWORD}\n",
        "users",
        "create",
        "--username",
        "ada",
        "--role",
        "op",
        "--password-stdin",
    )
    assert again.returncode == 1 and "exists already" in again.stderr
    short = _cli_input(
        env,
        "short\n",
        "users",
        "create",
        "--username",
        "bob",
        "--role",
        "viewer",
        "--password-stdin",
    )
    assert short.returncode == 1 and "at least 8 characters" in short.stderr
    assert invoke("users", "create", "--username", "x", "--role", "root", env=env).returncode == 2

    made = invoke(
        "tokens", "create", "--user", "ada", "--name", "ci", "--expires-in", "7d", env=env
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("sluice_") and "\n" not in token  # stdout: the token alone
    assert "shown only now" in made.stderr
    assert invoke("tokens", "create", "--user", "nobody", env=env).returncode == 1
    bad = invoke("tokens", "create", "--user", "ada", "--expires-in", "soon", env=env)
    assert bad.returncode == 1 and "invalid duration" in bad.stderr
    huge = invoke("tokens", "create", "--user", "ada", "--expires-in", "3000000d", env=env)
    assert huge.returncode == 1 and "--expires-in" in huge.stderr and "too long" in huge.stderr

    listed = invoke("tokens", "list", "--json", env=env)
    rows = json.loads(listed.stdout)
    assert [(r["user"], r["name"], r["state"]) for r in rows] == [("ada", "ci", "active")]
    assert token not in listed.stdout and token[len(rows[0]["prefix"]) :] not in listed.stdout
    users = invoke("users", "list", "--json", env=env)
    assert json.loads(users.stdout) == [
        {**json.loads(users.stdout)[0], "username": "ada", "role": "admin", "active_tokens": 1}
    ]
    assert "argon2" not in users.stdout

    assert invoke("tokens", "revoke", str(rows[0]["id"]), env=env).returncode == 0
    revoked = json.loads(invoke("tokens", "list", "--json", env=env).stdout)
    assert revoked[0]["state"] == "revoked"
    assert invoke("tokens", "revoke", "999", env=env).returncode == 1
    assert invoke("users", "set-role", "ada", "viewer", env=env).returncode == 0
    assert invoke("users", "delete", "ada", env=env).returncode == 0
    assert invoke("users", "delete", "ada", env=env).returncode == 1
    assert json.loads(invoke("users", "list", "--json", env=env).stdout) == []


def test_api_server_alone_answers_and_stops_on_sigterm(env: dict[str, str], tmp_path: Path) -> None:
    _create_user(env, "ada", "op")
    token = invoke("tokens", "create", "--user", "ada", env=env).stdout.strip()
    log = tmp_path / "api.log"
    proc = start_cli("api-server", "--port", "0", env=env, log=log)
    try:
        wait_ready(proc, log)
        url = _ready_url(log)
        assert _get(f"{url}api/v1/health") == (200, {"status": "ok"})
        status, ready = _get(f"{url}api/v1/health/ready")
        assert status == 200 and ready["parts"]["api"] == 1
        assert _get(f"{url}api/v1/me", token)[1]["username"] == "ada"
        assert _get(f"{url}api/v1/me")[0] == 401
        status, page = _get(f"{url}login")
        assert status == 200 and 'name="csrf_token"' in page
    finally:
        code = stop(proc)
    assert code == 0, log_tail(log)
    db = Database(env["SLUICE__CORE__SQL_ALCHEMY_CONN"])
    states = db.call(lambda s: [j.state for j in s.query(Job).filter(Job.job_type == "api")])
    db.dispose()
    assert states == ["success"]  # the job row ended with the process
    assert not (
        tmp_path / "home" / "fernet.key"
    ).exists()  # the API alone decrypts nothing: no key made


def test_sluice_run_prints_the_ui_address_at_readiness_and_serves_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "engine.log"
    proc = start_engine(env, log)
    try:
        url = _ready_url(log)
        status, ready = _get(f"{url}api/v1/health/ready")
        assert status == 200, ready
        assert all(ready["parts"][part] == 1 for part in ("scheduler", "executor", "api")), ready
        assert "sluice users create" in log.read_text()  # no user yet: how to make one
    finally:
        code = stop(proc)
    assert code == 0, log_tail(log)


def test_a_port_in_use_fails_the_start_naming_it(env: dict[str, str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("api-server", "--port", str(port), env=env)
        engine = run_cli("run", env={**env, "SLUICE__API__PORT": str(port)})
    for answer in (result, engine):
        assert answer.returncode == 1, answer.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in answer.stderr
        assert "Traceback" not in answer.stderr


def test_open_read_on_a_public_address_warns(tmp_path: Path, migrated_sqlite_url: str) -> None:
    env = sluice_env(
        tmp_path, SLUICE__CORE__SQL_ALCHEMY_CONN=migrated_sqlite_url, SLUICE__API__OPEN_READ="true"
    )
    log = tmp_path / "api.log"
    proc = start_cli("api-server", "--host", "0.0.0.0", "--port", "0", env=env, log=log)
    try:
        wait_ready(proc, log)
        assert "open_read is on and the API listens on 0.0.0.0" in log.read_text()
    finally:
        assert stop(proc) == 0, log_tail(log)
