"""The web UI's pages against the real application and database (SQLite and PostgreSQL),
in process: what each page shows, who sees which actions, that a viewer cannot act and that
a form needs its CSRF token. The browser tests (tests/browser/) drive the same pages in
Chromium against a running engine."""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from sqlalchemy import select, update

from engine.db.models import AssetEvent, Dag, DagRun, TaskInstance
from engine.task_log_files import log_path
from tests.db_templates import migrated_copy
from tests.integration.api_support import ApiHarness, csrf_of, parsed_ui

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi.testclient import TestClient

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


with DAG("producer", schedule=None, start_date=datetime(2026, 1, 1), tags=["reports"]):
    build()

with DAG("on_flag_and_report", schedule=flag & report):
    read()

with DAG("hourly", schedule="0 * * * *", start_date=datetime(2026, 1, 1)):
    read()
"""
FORM_POST = re.compile(r'<form[^>]*method="post"[^>]*action="([^"]+)"')


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def ui(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiHarness]:
    """One parsed database and application per backend for the module (tests that act use
    DAGs and assets of their own, so they do not see each other's changes)."""
    root = tmp_path_factory.mktemp("ui-pages")
    dags, inbox = root / "dags", root / "inbox"
    dags.mkdir()
    inbox.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox))))
    with migrated_copy(request, request.param, root) as url:
        yield from _ui_on(url, root, dags)


def _ui_on(url: str, root: Path, dags: Path) -> Iterator[ApiHarness]:
    yield from parsed_ui(url, root, dags, {"ada": "admin", "otto": "op", "vic": "viewer"})


def logged_in(api: ApiHarness, username: str) -> tuple[TestClient, str]:
    client = api.client()
    return client, api.login(client, username)


def post_forms(html: str) -> list[str]:
    """Where the page's POST forms go, but the log-out form every page has."""
    return [action for action in FORM_POST.findall(html) if action != "/logout"]


def run_ids(api: ApiHarness, dag_id: str) -> list[str]:
    query = select(DagRun.run_id).where(DagRun.dag_id == dag_id).order_by(DagRun.id)
    return list(api.db.call(lambda s: s.execute(query).scalars().all()))


def test_a_page_redirects_to_the_login_when_not_logged_in(ui: ApiHarness) -> None:
    answer = ui.client().get("/dags/producer/why")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login?next=/dags/producer/why"


def test_the_start_page_is_the_dag_list(ui: ApiHarness) -> None:
    client, _ = logged_in(ui, "vic")
    assert client.get("/").headers["location"] == "/dags"


def test_the_dag_list_shows_schedules_next_runs_and_paused(ui: ApiHarness) -> None:
    client, _ = logged_in(ui, "vic")
    html = client.get("/dags").text
    for dag_id in ("producer", "on_flag_and_report", "hourly"):
        assert f'data-dag="{dag_id}"' in html
    assert (
        "assets (flagged &amp; report/daily)" in html or "assets flagged &amp; report/daily" in html
    )
    assert "0 * * * *" in html
    assert "no runs yet" in html
    assert 'href="/dags/hourly/why"' in html
    searched = client.get("/dags", params={"search": "hour"}).text
    assert 'data-dag="hourly"' in searched and 'data-dag="producer"' not in searched


def test_a_viewer_sees_no_action_and_an_operator_sees_them(ui: ApiHarness) -> None:
    viewer, _ = logged_in(ui, "vic")
    for path in ("/dags", "/dags/producer", "/assets/report/daily"):
        page = viewer.get(path)
        assert page.status_code == 200, (path, page.text)
        assert post_forms(page.text) == [], path
    operator, _ = logged_in(ui, "otto")
    assert "/dags/producer/trigger" in post_forms(operator.get("/dags").text)
    assert 'href="/dags/producer/pause"' in operator.get("/dags/producer").text  # confirm first
    assert "/assets/report/daily/events" in post_forms(operator.get("/assets/report/daily").text)


def test_a_viewer_cannot_act_even_with_a_valid_form(ui: ApiHarness) -> None:
    viewer, csrf = logged_in(ui, "vic")
    for path in ("/dags/hourly/pause", "/dags/hourly/trigger", "/assets/flagged/events"):
        answer = viewer.post(path, data={"csrf_token": csrf})
        assert answer.status_code == 403, (path, answer.text)
    assert run_ids(ui, "hourly") == []


def test_a_form_without_or_with_a_wrong_csrf_token_is_refused(ui: ApiHarness) -> None:
    admin, _ = logged_in(ui, "ada")
    for data in ({}, {"csrf_token": "forged"}):
        answer = admin.post("/dags/hourly/trigger", data=data)
        assert answer.status_code == 403
        assert "CSRF" in answer.text
    assert run_ids(ui, "hourly") == []


def test_trigger_with_conf_is_confirmed_then_opens_the_new_run(ui: ApiHarness) -> None:
    admin, csrf = logged_in(ui, "ada")
    form = {"csrf_token": csrf, "conf": '{"rows": 3}'}
    review = admin.post("/dags/producer/trigger", data=form)
    assert review.status_code == 200 and "Create the run" in review.text
    assert run_ids(ui, "producer") == []  # nothing made before the confirmation
    answer = admin.post("/dags/producer/trigger", data={**form, "confirmed": "yes"})
    assert answer.status_code == 303, answer.text
    (run_id,) = run_ids(ui, "producer")
    location = answer.headers["location"]
    assert location.startswith("/dags/producer/runs/manual__")
    page = admin.get(location)
    assert page.status_code == 200
    assert run_id in page.text and "{&#34;rows&#34;: 3}" in page.text  # escaped once, by autoescape
    assert 'data-state="queued"' in page.text  # no scheduler runs in this test
    grid = admin.get("/dags/producer").text
    assert 'data-testid="runs-grid"' in grid and run_id in grid
    assert 'name="sluice-refresh"' in grid  # a run is going on: the page reloads itself


@pytest.mark.parametrize(
    ("conf", "problem"),
    [("[1, 2]", "conf must be a JSON object"), ("{nope", "conf is not valid JSON")],
)
def test_a_bad_conf_shows_the_dag_page_again_with_the_problem(
    ui: ApiHarness, conf: str, problem: str
) -> None:
    admin, csrf = logged_in(ui, "ada")
    before = run_ids(ui, "hourly")
    answer = admin.post("/dags/hourly/trigger", data={"csrf_token": csrf, "conf": conf})
    assert answer.status_code == 422
    assert problem in answer.text and 'role="alert"' in answer.text
    assert run_ids(ui, "hourly") == before


def test_pause_and_unpause_go_back_to_the_page(ui: ApiHarness) -> None:
    operator, csrf = logged_in(ui, "otto")
    paused = select(Dag.is_paused).where(Dag.dag_id == "on_flag_and_report")
    answer = operator.post(
        "/dags/on_flag_and_report/pause", data={"csrf_token": csrf, "next": "/dags?search=flag"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/dags?search=flag"
    assert ui.db.call(lambda s: s.execute(paused).scalar_one()) is True
    assert 'data-testid="paused">paused' in operator.get("/dags?search=flag").text
    answer = operator.post(
        "/dags/on_flag_and_report/unpause", data={"csrf_token": csrf, "next": "//evil.example"}
    )
    assert answer.headers["location"] == "/"  # never to another site
    assert ui.db.call(lambda s: s.execute(paused).scalar_one()) is False


def test_an_unknown_dag_or_asset_is_a_404(ui: ApiHarness) -> None:
    admin, csrf = logged_in(ui, "ada")
    html = {"accept": "text/html"}
    assert admin.get("/dags/nope", headers=html).status_code == 404
    assert admin.get("/dags/nope/runs/r1", headers=html).status_code == 404
    assert admin.get("/assets/nope", headers=html).status_code == 404
    assert admin.post("/dags/nope/pause", data={"csrf_token": csrf}).status_code == 404
    assert admin.post("/assets/nope/events", data={"csrf_token": csrf}).status_code == 404


def test_emit_an_event_shows_it_with_its_source_and_who(ui: ApiHarness) -> None:
    operator, csrf = logged_in(ui, "otto")
    answer = operator.post(
        "/assets/flagged/events", data={"csrf_token": csrf, "extra": '{"rows": 7}'}
    )
    assert answer.status_code == 303, answer.text
    event_id = ui.db.call(lambda s: s.execute(select(AssetEvent.id)).scalars().all())[-1]
    assert answer.headers["location"] == f"/assets/flagged?emitted={event_id}#event-{event_id}"
    page = operator.get(answer.headers["location"]).text
    row = page.split(f'id="event-{event_id}"', 1)[1].split("</tr>", 1)[0]
    assert "source-api" in row and "ui:otto" in row and "{&#34;rows&#34;: 7}" in row
    assert 'class="new"' in page.split(f'id="event-{event_id}"', 1)[1][:40]
    bad = operator.post("/assets/flagged/events", data={"csrf_token": csrf, "extra": "7"})
    assert bad.status_code == 422 and "extra must be a JSON object" in bad.text


def test_asset_names_with_a_slash_have_their_page(ui: ApiHarness) -> None:
    viewer, _ = logged_in(ui, "vic")
    page = viewer.get("/assets/report/daily")
    assert page.status_code == 200
    assert "producer/build" in page.text  # the task that updates it
    listing = viewer.get("/assets").text
    assert 'href="/assets/report/daily"' in listing and "flag-watch" in listing


def test_the_asset_graph_draws_watchers_assets_dags_and_tasks(ui: ApiHarness) -> None:
    viewer, _ = logged_in(ui, "vic")
    html = viewer.get("/asset-graph").text
    svg = html.split('data-testid="asset-graph"', 1)[1]
    for kind, node in [
        ("watcher", "watcher:flagged/flag-watch"),
        ("asset", "asset:flagged"),
        ("asset", "asset:report/daily"),
        ("dag", "dag:on_flag_and_report"),
        ("dag", "dag:producer"),
        ("task", "task:producer/build"),
    ]:
        assert f'data-kind="{kind}" data-id="{node}"' in svg, node
    for source, target in [
        ("watcher:flagged/flag-watch", "asset:flagged"),
        ("asset:report/daily", "dag:on_flag_and_report"),
        ("task:producer/build", "asset:report/daily"),
        ("dag:producer", "task:producer/build"),
    ]:
        assert f'data-source="{source}" data-target="{target}"' in svg
    assert 'href="/assets/report/daily"' in svg and 'href="/dags/producer"' in svg


def test_triggers_and_streams_pages(ui: ApiHarness) -> None:
    viewer, _ = logged_in(ui, "vic")
    triggers = viewer.get("/triggers")
    assert triggers.status_code == 200
    assert 'data-triggerer="unclaimed"' in triggers.text  # no triggerer runs here
    assert "DirectoryFileDeleteTrigger" in triggers.text
    assert "watcher flagged/flag-watch" in triggers.text or "flag-watch" in triggers.text
    streams = viewer.get("/streams")
    assert streams.status_code == 200 and "No shared-stream group is running" in streams.text


def test_a_task_page_without_a_log_and_its_log_tail(ui: ApiHarness) -> None:
    admin, csrf = logged_in(ui, "ada")
    admin.post("/dags/hourly/trigger", data={"csrf_token": csrf, "confirmed": "yes"})
    (run_id,) = run_ids(ui, "hourly")[-1:]
    page = admin.get(f"/dags/hourly/runs/{run_id}")
    assert page.status_code == 200
    assert f'href="/dags/hourly/runs/{quote(run_id, safe="")}/tasks/read"' in page.text
    task = admin.get(f"/dags/hourly/runs/{run_id}/tasks/read")
    assert task.status_code == 200
    assert "No log yet" in task.text  # no executor here: the try has not started
    assert "data-tail-url" in task.text and "log-tail.js" in task.text
    tail = admin.get(f"/dags/hourly/runs/{run_id}/tasks/read/log", params={"offset": 0})
    assert tail.json() == {"text": "", "offset": 0, "finished": False, "state": "none"}
    missing = admin.get(f"/dags/hourly/runs/{run_id}/tasks/nope", headers={"accept": "text/html"})
    assert missing.status_code == 404 and "no task" in missing.text


def test_the_log_tail_returns_what_a_running_try_wrote_after_an_offset(ui: ApiHarness) -> None:
    admin, csrf = logged_in(ui, "ada")
    admin.post("/dags/producer/trigger", data={"csrf_token": csrf, "confirmed": "yes"})
    run_id = run_ids(ui, "producer")[-1]
    set_state = update(TaskInstance).where(
        TaskInstance.dag_id == "producer", TaskInstance.task_id == "build"
    )
    ui.db.call(lambda s: s.execute(set_state.values(state="running", try_number=1)))
    path = log_path(ui.config.logging.task_log_folder, "producer", run_id, "build", 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("first line\n")
    base = f"/dags/producer/runs/{quote(run_id, safe='')}/tasks/build"
    page = admin.get(base).text
    assert "first line" in page and 'data-tail-url="' in page and 'data-offset="11"' in page
    with path.open("a") as log:
        log.write("second line é\n")
    tail = admin.get(f"{base}/log", params={"try": 1, "offset": 11}).json()
    assert tail == {"text": "second line é\n", "offset": 26, "finished": False, "state": "running"}
    assert admin.get(f"{base}/log", params={"try": 1, "offset": 26}).json()["text"] == ""
    ui.db.call(lambda s: s.execute(set_state.values(state="success")))
    done = admin.get(f"{base}/log", params={"try": 1, "offset": 26}).json()
    assert done == {"text": "", "offset": 26, "finished": True, "state": "success"}
    finished_page = admin.get(base).text
    assert "first line" in finished_page and "data-tail-url" not in finished_page
    escape = admin.get(f"{base}/log", params={"try": 1, "offset": 0}).json()
    assert escape["text"].startswith("first line")


def test_clear_a_failed_task_so_that_it_runs_again(ui: ApiHarness) -> None:
    operator, csrf = logged_in(ui, "otto")
    operator.post("/dags/producer/trigger", data={"csrf_token": csrf, "confirmed": "yes"})
    run_id = run_ids(ui, "producer")[-1]
    task = (
        select(TaskInstance.state)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(DagRun.run_id == run_id, TaskInstance.task_id == "build")
    )
    fail = update(TaskInstance).where(
        TaskInstance.dag_run_id.in_(select(DagRun.id).where(DagRun.run_id == run_id))
    )
    ui.db.call(lambda s: s.execute(fail.values(state="failed", try_number=1)))
    run_page = f"/dags/producer/runs/{quote(run_id, safe='')}"
    assert f'href="{run_page}/tasks/build/clear?next=' in operator.get(run_page).text
    viewer, viewer_csrf = logged_in(ui, "vic")
    refused = viewer.post(f"{run_page}/tasks/build/clear", data={"csrf_token": viewer_csrf})
    assert refused.status_code == 403
    assert ui.db.call(lambda s: s.execute(task).scalar_one()) == "failed"
    answer = operator.post(f"{run_page}/tasks/build/clear", data={"csrf_token": csrf})
    assert answer.status_code == 303 and answer.headers["location"] == run_page
    assert ui.db.call(lambda s: s.execute(task).scalar_one()) == "none"
    assert 'data-state="none"' in operator.get(run_page).text


def test_why_names_the_asset_still_missing_and_its_watcher(ui: ApiHarness) -> None:
    client, _ = logged_in(ui, "vic")
    page = client.get("/dags/on_flag_and_report/why")
    assert page.status_code == 200, page.text
    html = page.text
    assert "Still missing" in html
    assert 'data-asset="flagged"' in html and 'data-watcher="flag-watch"' in html
    assert "DirectoryFileDeleteTrigger" in html
    assert "not claimed" in html  # no triggerer runs in this test
    assert 'href="/assets/report/daily"' in html


def test_why_of_an_unknown_dag_is_a_404_page(ui: ApiHarness) -> None:
    client, _ = logged_in(ui, "vic")
    page = client.get("/dags/nope/why", headers={"accept": "text/html"})
    assert page.status_code == 404
    assert "no DAG &#39;nope&#39;" in page.text


def test_the_login_csrf_field_is_on_the_login_page(ui: ApiHarness) -> None:
    assert csrf_of(ui.client().get("/login").text)
