"""``sluice dags why`` against a real ``sluice run``: a DAG on ``a & b`` whose watcher of
``a`` fired waits for ``b``, and says so with the watchers' triggerer, heartbeat and events;
the REST endpoint answers the same view from that engine's database; an unknown DAG exits 1.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient

from engine.api import credentials
from engine.api.app import create_app
from engine.config import load_config
from engine.db.models import utcnow
from engine.db.queries import users as users_sql
from tests.e2e.helpers import asset_event_count, run_cli, running_engine, wait_for

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from engine.db.database import Database

pytestmark = pytest.mark.e2e

DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger


def watched(name):
    trigger = DirectoryFileDeleteTrigger(
        directory=INBOX, filename=f"{name}.flag", poke_interval=0.1
    )
    return Asset(name, watchers=[AssetWatcher(f"{name}-w", trigger)])


@task
def noop():
    return None


with DAG("both", schedule=watched("a") & watched("b")):
    noop()
"""


def why_json(env: Mapping[str, str]) -> dict[str, Any]:
    done = run_cli("dags", "why", "both", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_dags_why_explains_a_dag_waiting_for_an_asset(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    files = {"both.py": DAGS.replace("INBOX", repr(str(inbox)))}
    with running_engine(tmp_path, files, ["both"]) as engine:
        env, db = engine["env"], engine["db"]
        # Both watchers claimed by the engine's live triggerer, their group published.
        wait_for(
            lambda: all(
                w["status"] == "ok" and w["shared_stream"] and w["shared_stream"]["snapshot"]
                for a in why_json(env)["assets"]
                for w in a["watchers"]
            ),
            timeout=60,
            what="both watchers running on a live triggerer",
        )
        (inbox / "a.flag").touch()
        wait_for(lambda: asset_event_count(db, "a") == 1, timeout=30, what="the event of a")

        done = run_cli("dags", "why", "both", env=env)
        assert done.returncode == 0, done.stderr
        text = done.stdout
        verdict = next(line for line in text.splitlines() if line.startswith("verdict: "))
        assert verdict.startswith("verdict: waiting for asset b (no event queued for this DAG yet)")
        assert "its watcher b-w runs on triggerer" in verdict
        assert "condition: not met; missing: b" in text
        assert "    [x] asset a: 1 event(s) queued" in text
        assert "    [ ] asset b: no event queued" in text
        assert "asset a: 1 event(s) queued (watcher: 1)" in text
        assert (
            "watcher a-w: trigger" in text
            and "triggers.file.DirectoryFileDeleteTrigger [ok]" in text
        )
        assert text.count(": alive, heartbeat") == 2
        assert "shared stream: 2 trigger(s), held by triggerer" in text
        assert "engine: 1 scheduler(s) and 1 triggerer(s) alive" in text
        assert "a.flag" not in text  # trigger kwargs are never shown

        rest = _rest_view(env, db)
        assert rest["verdict"] == why_json(env)["verdict"]
        assert rest["schedule"]["assets"]["missing"] == "b"

        unknown = run_cli("dags", "why", "nope", env=env)
        assert unknown.returncode == 1
        assert unknown.stderr.startswith("error: no DAG 'nope'; `sluice dags list`")


def _rest_view(env: Mapping[str, str], db: Database) -> dict[str, Any]:
    """``GET /api/v1/dags/both/why`` from the API application on the engine's database, with a
    viewer's token made as ``sluice tokens create`` makes one."""
    add_user = partial(
        users_sql.add_user,
        username="viewer",
        role=credentials.VIEWER,
        password_hash=credentials.hash_password("correct horse battery"),
        now=utcnow(),
    )
    db.call(add_user)
    token = credentials.new_token()
    add_token = partial(
        users_sql.add_token,
        username="viewer",
        token_hash=credentials.digest(token),
        prefix=credentials.shown_prefix(token),
        name="e2e",
        expires_at=None,
        now=utcnow(),
    )
    db.call(add_token)
    app = create_app(load_config(environ=dict(env)), db)
    with TestClient(app) as client:
        answer = client.get("/api/v1/dags/both/why", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())
