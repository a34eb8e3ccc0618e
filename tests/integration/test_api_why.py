"""``GET /api/v1/dags/{dag_id}/why`` against the real application and database (SQLite and
PostgreSQL), on DAG files parsed by the real DAG processor: the answer is ``explain_dag``'s,
it needs a reader, an unknown DAG is a 404 problem, and no trigger kwargs leak."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from engine.api import credentials
from engine.api.app import create_app
from engine.db.models import Trigger, utcnow
from engine.db.queries import assets as assets_sql
from engine.views.why import explain_dag
from tests.integration.api_support import ApiHarness, bearer
from tests.integration.harness import parsed_database

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger

secret_name = "s3cr3t-flag-name.flag"
a = Asset("a")
b = Asset("b", watchers=[AssetWatcher("b-w", DirectoryFileDeleteTrigger(
    directory=INBOX, filename=secret_name, poke_interval=0.1))])


@task
def noop():
    return None


with DAG("both", schedule=a & b):
    noop()
"""


@pytest.fixture
def api(migrated_db_url: str, tmp_path: Path) -> Iterator[ApiHarness]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "both.py").write_text(DAGS.replace("INBOX", repr(str(tmp_path))))
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    yield ApiHarness(db=parsed.db, config=parsed.config, app=create_app(parsed.config, parsed.db))
    parsed.db.dispose()


@pytest.mark.both_databases
def test_why_answers_the_view_to_a_reader(api: ApiHarness) -> None:
    api.db.call(
        lambda s: assets_sql.emit_asset_event(s, "a", extra=None, source="api", created_by="t")
    )
    api.user("vic", credentials.VIEWER)
    answer = api.client().get("/api/v1/dags/both/why", headers=bearer(api.token("vic")))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = api.db.call(lambda s: explain_dag(s, "both", now=utcnow()))
    assert body.keys() == expected.keys()
    assert body["schedule"]["assets"]["missing"] == "b"
    assert body["verdict"].startswith("waiting for asset b (no event queued for this DAG yet)")
    assert body["assets"][0]["queued"]["sources"] == {"api": 1}
    (watcher,) = body["assets"][1]["watchers"]
    assert watcher["classpath"] == "triggers.file.DirectoryFileDeleteTrigger"
    assert watcher["status"] == "unclaimed"
    # Never the trigger's kwargs: the file name is only in them, the token is their cipher.
    tokens = api.db.call(lambda s: list(s.execute(select(Trigger.kwargs)).scalars()))
    assert "s3cr3t" not in answer.text and not any(t in answer.text for t in tokens)


def test_why_needs_a_reader_and_knows_unknown_dags(api: ApiHarness) -> None:
    client = api.client()
    anonymous = client.get("/api/v1/dags/both/why")
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"] == "application/problem+json"
    api.user("vic", credentials.VIEWER)
    unknown = client.get("/api/v1/dags/nope/why", headers=bearer(api.token("vic")))
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"
    assert unknown.json()["detail"].startswith("no DAG 'nope'; `sluice dags list`")


def test_the_openapi_schema_lists_why(api: ApiHarness) -> None:
    api.user("reader", "viewer")
    token = bearer(api.token("reader"))
    schema = api.client().get("/api/v1/openapi.json", headers=token).json()
    assert "get" in schema["paths"]["/api/v1/dags/{dag_id}/why"]
