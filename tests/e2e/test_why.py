"""``sluice dags why`` against a real ``sluice run``: a DAG on ``a & b`` whose watcher of
``a`` fired waits for ``b``, and says so with the watchers' triggerer, heartbeat and events;
``GET /api/v1/dags/both/why`` of that engine's API part answers the same, to a token made by
``sluice tokens create``; an unknown DAG exits 1 (and is a 404 over the API).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from tests.cli import invoke
from tests.e2e.helpers import asset_event_count, log_tail, running_engine, wait_for

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

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
    done = invoke("dags", "why", "both", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_dags_why_explains_a_dag_waiting_for_an_asset(
    tmp_path: Path, sqlite_template: Path
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    files = {"both.py": DAGS.replace("INBOX", repr(str(inbox)))}
    with running_engine(tmp_path, files, ["both"], template=sqlite_template) as engine:
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

        done = invoke("dags", "why", "both", env=env)
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

        url, token = _api(engine["log"], env)
        status, rest = _get(f"{url}api/v1/dags/both/why", token)
        assert status == 200, rest
        assert rest["verdict"] == why_json(env)["verdict"]
        assert rest["schedule"]["assets"]["missing"] == "b"
        assert "a.flag" not in json.dumps(rest)
        status, problem = _get(f"{url}api/v1/dags/nope/why", token)
        assert status == 404 and problem["detail"].startswith("no DAG 'nope'")
        assert _get(f"{url}api/v1/dags/both/why", None)[0] == 401

        unknown = invoke("dags", "why", "nope", env=env)
        assert unknown.returncode == 1
        assert unknown.stderr.startswith("error: no DAG 'nope'; `sluice dags list`")


URL_IN_READY_LINE = re.compile(r"Sluice ready: .*UI and API at (http://127\.0\.0\.1:\d+/)")


def _api(log: Path, env: Mapping[str, str]) -> tuple[str, str]:
    """The address ``sluice run`` printed at readiness, and a viewer's token made by
    ``sluice users create`` and ``sluice tokens create``."""
    match = URL_IN_READY_LINE.search(log.read_text())
    assert match is not None, log_tail(log)
    made = invoke(
        *("users", "create", "--username", "vic", "--role", "viewer", "--password-stdin"),
        env=env,
        input="a long enough password\n",
    )
    assert made.returncode == 0, made.stderr
    token = invoke("tokens", "create", "--user", "vic", env=env)
    assert token.returncode == 0, token.stderr
    return match.group(1), token.stdout.strip()


def _get(url: str, token: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
