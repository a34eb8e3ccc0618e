"""Small truths of the web UI against the real application and database, in process: the
operator column names the class (its DAG file's module on hover), an event's extra shows
its markup as text (escaped once), and the why page states its verdict once, writes times
as a person reads them and says "not updated yet" only of an asset that never had an event.

SQLite only: what is checked is how pages write what the read model gives, the same on
either database (``test_ui_pages`` covers the pages on both).
"""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from sqlalchemy import delete, select, update

from engine.db.models import AssetEventQueue, DagRun, Trigger
from tests.db_templates import migrated_copy
from tests.integration.api_support import ApiHarness, parsed_ui

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

DAGS = """
from datetime import datetime

from engine import DAG, Asset, AssetWatcher, BaseOperator
from triggers import DirectoryFileDeleteTrigger


class CopyRows(BaseOperator):
    def execute(self, context):
        return 1


seen = Asset("seen")  # gets an event; the DAG's queue is then emptied, as a run would
fresh = Asset("fresh")  # never gets one
watched = Asset("watched", watchers=[AssetWatcher("flag", DirectoryFileDeleteTrigger(
    directory={inbox!r}, filename="go.flag", poke_interval=1))])

with DAG("copies", schedule=None, start_date=datetime(2026, 1, 1)):
    CopyRows(task_id="copy")

with DAG("on_both", schedule=seen & fresh):
    CopyRows(task_id="load")

with DAG("on_watched", schedule=watched):
    CopyRows(task_id="load")
"""
#: An ISO time with its fraction of a second in a page's text (outside any tag): what the
#: why page used to write inside its sentences.
RAW_ISO_IN_TEXT = re.compile(r">[^<]*\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d+[^<]*<")
#: A time the why page writes: the ISO value on the element, the words a moment ago.
READABLE_TIME = re.compile(
    r'<time datetime="([^"]+)" title="\1">'
    r"\d{4}-\d\d-\d\d \d\d:\d\d UTC, (just now|\d+ s ago)</time>"
)
MARKUP = "<script>alert(1)</script> é"


@pytest.fixture(scope="module")
def ui(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiHarness]:
    root = tmp_path_factory.mktemp("ui-truths")
    dags = root / "dags"
    dags.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(root))))
    with migrated_copy(request, "sqlite", root) as url:
        yield from parsed_ui(url, root, dags, {"ada": "admin"})


@pytest.fixture(scope="module")
def admin(ui: ApiHarness) -> tuple[TestClient, str]:
    client = ui.client()
    return client, ui.login(client, "ada")


def test_the_operator_column_names_the_class_with_its_module_on_hover(
    ui: ApiHarness, admin: tuple[TestClient, str]
) -> None:
    client, csrf = admin
    answer = client.post("/dags/copies/trigger", data={"csrf_token": csrf, "confirmed": "yes"})
    assert answer.status_code == 303, answer.text
    run_id = ui.db.call(
        lambda s: s.execute(select(DagRun.run_id).where(DagRun.dag_id == "copies")).scalar_one()
    )
    run_page = client.get(f"/dags/copies/runs/{quote(run_id, safe='')}").text
    cell = re.search(r'<code class="classname" title="([^"]+)">([^<]+)</code>', run_page)
    assert cell is not None, run_page
    hover, name = cell.groups()
    assert name == "CopyRows"
    assert re.fullmatch(
        r"CopyRows, defined in the DAG file flows \(module sluice_dag_\w+_flows\)", hover
    )
    assert ">sluice_dag_" not in run_page  # the module is never the text of a cell
    task_page = client.get(f"/dags/copies/runs/{quote(run_id, safe='')}/tasks/copy").text
    assert f'title="{hover}">CopyRows</code>' in task_page


def test_an_events_extra_shows_its_markup_as_text_escaped_once(
    admin: tuple[TestClient, str],
) -> None:
    client, csrf = admin
    extra = '{"note": "' + MARKUP.replace('"', '\\"') + '"}'
    answer = client.post("/assets/seen/events", data={"csrf_token": csrf, "extra": extra})
    assert answer.status_code == 303, answer.text
    page = client.get("/assets/seen").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; é" in page  # once: the browser shows <script>
    assert "\\u003c" not in page and "&amp;lt;" not in page and "<script>alert" not in page


def test_the_why_page_says_its_verdict_once_with_readable_times_and_true_asset_words(
    ui: ApiHarness, admin: tuple[TestClient, str]
) -> None:
    client, csrf = admin
    answer = client.post("/assets/seen/events", data={"csrf_token": csrf})
    assert answer.status_code == 303, answer.text
    # as a run would: the DAG took what was queued for it (no scheduler runs here)
    ui.db.call(
        lambda s: s.execute(delete(AssetEventQueue).where(AssetEventQueue.dag_id == "on_both"))
    )
    why = client.get("/api/v1/dags/on_both/why").json()
    verdict = why["verdict"]
    assert "its last event was at" in verdict  # an ISO time the API keeps for machines
    page = client.get("/dags/on_both/why").text

    shown = page.split('data-testid="verdict"', 1)[1].split("</p>", 1)[0]
    assert 'data-code="assets_missing"' in page and "blocker" in shown
    head = verdict.split(" at ", 1)[0]  # the verdict's words before its first time
    assert page.count(head) == 1  # said once: not again in the findings table
    assert READABLE_TIME.search(shown), shown  # the event came a moment ago
    assert RAW_ISO_IN_TEXT.search(page) is None, RAW_ISO_IN_TEXT.search(page)

    status = dict(
        re.findall(
            r'data-asset="([^"]+)">\s*<h2>.*?data-testid="asset-status">([^<]+)<', page, re.S
        )
    )
    assert status == {"seen": "✗ no new event for this DAG", "fresh": "✗ not updated yet"}


def test_a_long_trigger_error_is_shown_whole_in_a_bounded_box_on_each_page(
    ui: ApiHarness, admin: tuple[TestClient, str]
) -> None:
    error = "Traceback (most recent call last):\n" + "  File <x>, line 1\n" * 400 + "BoomError"
    ui.db.call(lambda s: s.execute(update(Trigger).values(failure_count=3, last_error=error)))
    client, _ = admin
    for path in ("/triggers", "/dags/on_watched/why", "/assets/watched"):
        page = client.get(path).text
        box = page.split('<div class="value error">', 1)[1].split("</div>", 1)[0]
        assert box.startswith("Traceback") and box.endswith("BoomError"), path  # all of it
        assert "File &lt;x&gt;, line 1" in box  # escaped once, in a box that scrolls (CSS)


def test_every_page_links_the_favicon(admin: tuple[TestClient, str]) -> None:
    client, _ = admin
    assert (
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        in client.get("/dags").text
    )
    icon = client.get("/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg")
