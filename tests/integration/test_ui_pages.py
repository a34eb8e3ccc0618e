"""The web UI's pages against the real application and database (SQLite and PostgreSQL),
in process: what each page shows, who sees which actions, and that a form needs its CSRF
token. The browser tests (tests/browser/) drive the same pages in Chromium."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.api_support import ApiHarness, api_harness
from tests.integration.harness import parsed_database

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
from datetime import datetime

from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger

INBOX = {inbox!r}
flag = Asset("flagged", watchers=[AssetWatcher("flag-watch", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="go.flag", poke_interval=1))])
report = Asset("report/daily")


@task(outlets=[report])
def build():
    return 1


@task
def read():
    return 2


with DAG("producer", schedule=None, start_date=datetime(2026, 1, 1)):
    build()

with DAG("on_flag_and_report", schedule=flag & report):
    read()

with DAG("hourly", schedule="0 * * * *", start_date=datetime(2026, 1, 1)):
    read()
"""


@pytest.fixture
def ui(db_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    dags, inbox = tmp_path / "dags", tmp_path / "inbox"
    dags.mkdir()
    inbox.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox))))
    parsed = parsed_database(db_url, tmp_path, dags)
    parsed.db.dispose()
    api = api_harness(db_url, tmp_path)
    api.user("ada", "admin")
    api.user("otto", "op")
    api.user("vic", "viewer")
    try:
        yield {"api": api}
    finally:
        api.db.dispose()


def logged_in(api: ApiHarness, username: str) -> Any:
    client = api.client()
    api.login(client, username)
    return client


def test_a_page_redirects_to_the_login_when_not_logged_in(ui: dict[str, Any]) -> None:
    answer = ui["api"].client().get("/dags/producer/why")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login?next=/dags/producer/why"


def test_why_names_the_asset_still_missing_and_its_watcher(ui: dict[str, Any]) -> None:
    page = logged_in(ui["api"], "vic").get("/dags/on_flag_and_report/why")
    assert page.status_code == 200, page.text
    html = page.text
    assert "Still missing" in html
    assert 'data-asset="flagged"' in html and 'data-watcher="flag-watch"' in html
    assert "DirectoryFileDeleteTrigger" in html
    assert "not claimed" in html  # no triggerer runs in this test
    assert 'href="/assets/report/daily"' in html


def test_why_of_an_unknown_dag_is_a_404_page(ui: dict[str, Any]) -> None:
    page = logged_in(ui["api"], "vic").get("/dags/nope/why", headers={"accept": "text/html"})
    assert page.status_code == 404
    assert "no DAG &#39;nope&#39;" in page.text
