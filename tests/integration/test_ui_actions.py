"""The UI's actions over HTTP against the real application and database (SQLite and
PostgreSQL), in process: mark success / failed with downstream / upstream, clear with
options, cancel a run, pause / unpause from the DAG page. Each ``GET`` is a confirmation that
lists exactly the task instances it would change and changes nothing; its form ``POST``s
(CSRF-checked, op and admin only) and the page it leads to says once what changed. And the
DAG files that fail to parse: the DAG list's banner and ``/import-errors``.

The browser tests (``tests/browser/test_ui_actions.py``) drive the same pages in Chromium.
"""

from __future__ import annotations

import re
import textwrap
from html import unescape
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
from sqlalchemy import select, update

from engine.db.models import Dag, DagRun, TaskInstance, utcnow
from engine.db.queries import mapping
from engine.views import operations
from tests.db_templates import migrated_copy
from tests.integration.api_support import ApiHarness, api_harness
from tests.integration.harness import parse_in_process, parsed_database

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

DAGS = """
from datetime import datetime

from engine import DAG, task


@task
def extract():
    return 1


@task
def transform(value):
    return value


@task
def load(value):
    return value


with DAG("chain", schedule=None, start_date=datetime(2026, 1, 1)):
    load(transform(extract()))

with DAG("hourly", schedule="0 * * * *", start_date=datetime(2026, 1, 1)):
    extract()

with DAG("fanout", schedule=None, start_date=datetime(2026, 1, 1)):
    transform.expand(value=[1, 2, 3])
"""
BROKEN = "from engine import DAG\n\n\ndef broken(:  # <script>alert(1)</script>\n    pass\n"
FORM_POST = re.compile(r'<form[^>]*method="post"[^>]*action="([^"]+)"')
NOTICE = re.compile(r'<p class="notice" role="status">([^<]*)</p>')
AFFECTED_ROW = re.compile(r'<tr data-task="([^"]+)">')


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def ui(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiHarness]:
    """One parsed database and application per backend; a broken DAG file parsed after the
    good one (its error is stored as the DAG processor stores it). Each test acts on runs
    of its own."""
    root = tmp_path_factory.mktemp("ui-actions")
    dags = root / "dags"
    dags.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS))
    with migrated_copy(request, request.param, root) as url:
        parsed = parsed_database(url, root, dags)
        (dags / "broken.py").write_text(BROKEN)
        assert parse_in_process(parsed.db, parsed.cipher, dags).errors
        parsed.db.dispose()
        api = api_harness(url, root)
        for name, role in (("ada", "admin"), ("otto", "op"), ("vic", "viewer")):
            api.user(name, role)
        try:
            yield api
        finally:
            api.db.dispose()


def logged_in(api: ApiHarness, username: str) -> tuple[TestClient, str]:
    client = api.client()
    return client, api.login(client, username)


def new_run(api: ApiHarness, states: dict[str, str], dag_id: str = "chain") -> str:
    """A manual run of ``dag_id`` whose task instances are in ``states`` (others: none)."""

    def make(session: Any) -> str:
        made = operations.trigger_dag(session, dag_id, conf=None, logical_date=None, now=utcnow())
        return str(made["run_id"])

    run_id = api.db.call(make)
    run_pk = select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    for task_id, state in states.items():
        change = (
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == run_pk.scalar_subquery())
            .where(TaskInstance.task_id == task_id)
            .values(state=state, try_number=1)
        )
        api.db.call(lambda s, c=change: s.execute(c))
    return run_id


def states_of(api: ApiHarness, run_id: str) -> dict[str, str]:
    query = (
        select(TaskInstance.task_id, TaskInstance.state)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(DagRun.run_id == run_id)
    )
    return dict(api.db.call(lambda s: s.execute(query).all()))


def run_state(api: ApiHarness, run_id: str) -> str:
    query = select(DagRun.state).where(DagRun.run_id == run_id)
    return str(api.db.call(lambda s: s.execute(query).scalar_one()))


def run_page(run_id: str, dag_id: str = "chain") -> str:
    return f"/dags/{dag_id}/runs/{quote(run_id, safe='')}"


def affected(html: str) -> list[str]:
    return AFFECTED_ROW.findall(html)


def notice(html: str) -> str | None:
    found = NOTICE.search(html)
    return None if found is None else unescape(found.group(1))


def form_fields(html: str) -> dict[str, str]:
    """The hidden fields of a confirmation's form."""
    return {
        name: unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html)
    }


def confirm_and_post(client: TestClient, url: str, params: dict[str, str]) -> tuple[str, str]:
    """GET the confirmation, POST its form as a browser would; (the confirmation's HTML,
    where the action redirected to)."""
    page = client.get(url, params=params)
    assert page.status_code == 200, page.text
    actions = FORM_POST.findall(page.text)
    assert actions[-1] == url, actions
    answer = client.post(url, data=form_fields(page.text))
    assert answer.status_code == 303, answer.text
    return page.text, answer.headers["location"]


def test_a_viewer_sees_no_action_and_cannot_confirm_nor_act(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "failed"})
    viewer, csrf = logged_in(ui, "vic")
    task = f"{run_page(run_id)}/tasks/extract"
    for path in ("/dags/chain", run_page(run_id), task):
        html = viewer.get(path).text
        for action in ("/mark", "/clear", "/cancel", "/pause"):
            assert f'{action}"' not in html and f"{action}?" not in html, (path, action)
    posts = {
        f"{task}/mark": {"state": "success"},
        f"{task}/clear": {},
        f"{run_page(run_id)}/clear": {},
        f"{run_page(run_id)}/cancel": {},
        "/dags/chain/pause": {},
    }
    for path, data in posts.items():
        assert viewer.get(path, params=data).status_code == 403, path
        assert viewer.post(path, data={**data, "csrf_token": csrf}).status_code == 403, path
    assert states_of(ui, run_id)["extract"] == "failed"
    assert run_state(ui, run_id) == "queued"


def test_an_action_without_its_csrf_token_is_refused(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "failed"})
    operator, _ = logged_in(ui, "otto")
    task = f"{run_page(run_id)}/tasks/extract"
    for path, data in (
        (f"{task}/mark", {"state": "success"}),
        (f"{task}/clear", {}),
        (f"{run_page(run_id)}/cancel", {}),
        ("/dags/chain/pause", {}),
    ):
        for token in ({}, {"csrf_token": "forged"}):
            answer = operator.post(path, data={**data, **token})
            assert answer.status_code == 403 and "CSRF" in answer.text, path
    assert states_of(ui, run_id)["extract"] == "failed"
    assert run_state(ui, run_id) == "queued"


def test_mark_success_with_downstream_lists_then_marks_and_says_so_once(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "failed", "transform": "upstream_failed"})
    operator, _ = logged_in(ui, "otto")
    task = f"{run_page(run_id)}/tasks/transform"
    html = operator.get(task).text
    assert f'action="{task}/mark"' in html and f'action="{task}/clear"' in html
    confirmation = operator.get(f"{task}/mark", params={"state": "success", "downstream": "true"})
    assert affected(confirmation.text) == ["load", "transform"]
    assert states_of(ui, run_id)["transform"] == "upstream_failed"  # the GET changed nothing
    page, location = confirm_and_post(
        operator, f"{task}/mark", {"state": "success", "downstream": "true"}
    )
    assert "Mark 2 task instances success" in page
    assert location == task
    assert states_of(ui, run_id) == {"extract": "failed", "transform": "success", "load": "success"}
    shown = operator.get(location)
    said = notice(shown.text)
    assert said == "Marked 2 task instances success: load, transform.", said
    assert notice(operator.get(location).text) is None  # once
    assert "sluice_flash" in shown.headers.get("set-cookie", "")  # deleted with the page


def test_mark_failed_with_upstream_and_nothing_left_to_mark(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "success", "transform": "running"})
    operator, _ = logged_in(ui, "otto")
    task = f"{run_page(run_id)}/tasks/transform"
    params = {"state": "failed", "upstream": "true"}
    page, location = confirm_and_post(operator, f"{task}/mark", params)
    assert affected(page) == ["extract", "transform"]
    assert states_of(ui, run_id) == {"extract": "failed", "transform": "failed", "load": "none"}
    assert "Marked 2 task instances failed: extract, transform." in str(
        notice(operator.get(location).text)
    )
    again = operator.get(f"{task}/mark", params=params)
    assert "already failed" in again.text
    assert FORM_POST.findall(again.text) == ["/logout"]  # nothing to confirm


def test_clear_a_task_with_options_and_a_run_s_failed_tasks(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "success", "transform": "failed", "load": "upstream_failed"})
    operator, _ = logged_in(ui, "otto")
    task = f"{run_page(run_id)}/tasks/extract"
    params = {"downstream": "true", "only_failed": "true"}
    page, location = confirm_and_post(operator, f"{task}/clear", params)
    assert affected(page) == ["load", "transform"]
    assert location == task
    assert states_of(ui, run_id) == {"extract": "success", "transform": "none", "load": "none"}
    said = notice(operator.get(location).text)
    assert said == "Cleared 2 task instances: load, transform; they run again.", said
    # the whole run, only its failed tasks: now none
    failed_run = new_run(ui, {"extract": "success", "transform": "failed"})
    page, location = confirm_and_post(
        operator, f"{run_page(failed_run)}/clear", {"only_failed": "true"}
    )
    assert affected(page) == ["transform"]
    assert location == run_page(failed_run)
    assert states_of(ui, failed_run)["transform"] == "none"
    assert states_of(ui, failed_run)["extract"] == "success"


def test_a_run_page_offers_cancel_while_it_goes_on_and_cancel_ends_it(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "success", "transform": "running"})
    operator, _ = logged_in(ui, "otto")
    url = run_page(run_id)
    html = operator.get(url).text
    assert f'href="{url}/cancel"' in html and f'href="{url}/clear?only_failed=true"' in html
    assert f"{url}/tasks/load/mark?state=success" in unescape(html)
    page, location = confirm_and_post(operator, f"{url}/cancel", {})
    assert affected(page) == ["load", "transform"]  # extract already ended
    assert states_of(ui, run_id) == {"extract": "success", "transform": "failed", "load": "skipped"}
    assert run_state(ui, run_id) == "failed"
    said = notice(operator.get(location).text)
    assert said == (
        f"Cancelled run {run_id}: it is failed. "
        "1 task instance failed: transform; 1 task instance skipped: load."
    ), said
    after = operator.get(url).text
    assert f'href="{url}/cancel"' not in after
    assert "already ended" in operator.get(f"{url}/cancel").text
    late = operator.post(f"{url}/cancel", data=form_fields(page))
    assert late.status_code == 303
    assert "Nothing cancelled" in str(notice(operator.get(late.headers["location"]).text))


def test_pause_and_unpause_from_the_dag_page_with_a_confirmation(ui: ApiHarness) -> None:
    admin, _ = logged_in(ui, "ada")
    paused = select(Dag.is_paused).where(Dag.dag_id == "hourly")
    assert 'href="/dags/hourly/pause"' in admin.get("/dags/hourly").text
    page, location = confirm_and_post(admin, "/dags/hourly/pause", {})
    assert "waits in the queue" in page
    assert location == "/dags/hourly"
    assert ui.db.call(lambda s: s.execute(paused).scalar_one()) is True
    shown = admin.get(location).text
    assert notice(shown) == "Paused hourly: the scheduler starts nothing of it."
    assert 'href="/dags/hourly/unpause"' in shown
    assert "already paused" in admin.get("/dags/hourly/pause").text
    confirm_and_post(admin, "/dags/hourly/unpause", {})
    assert ui.db.call(lambda s: s.execute(paused).scalar_one()) is False


def test_mark_and_clear_one_copy_of_a_mapped_task(ui: ApiHarness) -> None:
    run_id = new_run(ui, {}, dag_id="fanout")
    run_pk = select(DagRun.id).where(DagRun.run_id == run_id).scalar_subquery()
    ui.db.call(
        lambda s: mapping.expand_task(
            s, s.execute(select(run_pk)).scalar_one(), "transform", 3, now=utcnow()
        )
    )
    operator, _ = logged_in(ui, "otto")
    task = f"{run_page(run_id, 'fanout')}/tasks/transform"
    html = unescape(operator.get(run_page(run_id, "fanout")).text)
    assert f"{task}/mark?state=success&map_index=1&next=" in html
    page, location = confirm_and_post(
        operator, f"{task}/mark", {"state": "success", "map_index": "1"}
    )
    assert affected(page) == ["transform[1]"]
    assert location == f"{task}?map_index=1"
    said = notice(operator.get(location).text)
    assert said == "Marked 1 task instance success: transform[1].", said
    copies = (
        select(TaskInstance.map_index, TaskInstance.state)
        .where(TaskInstance.dag_run_id == run_pk)
        .order_by(TaskInstance.map_index)
    )
    assert ui.db.call(lambda s: s.execute(copies).all()) == [
        (0, "scheduled"),
        (1, "success"),
        (2, "scheduled"),
    ]
    page, _ = confirm_and_post(operator, f"{task}/clear", {"map_index": "1"})
    assert affected(page) == ["transform[1]"]
    assert ui.db.call(lambda s: s.execute(copies).all())[1] == (1, "none")


def test_unknown_targets_are_404_and_bad_options_4xx(ui: ApiHarness) -> None:
    run_id = new_run(ui, {})
    operator, csrf = logged_in(ui, "otto")
    task = f"{run_page(run_id)}/tasks"
    assert operator.get(f"{task}/nope/mark", params={"state": "failed"}).status_code == 404
    assert operator.get(f"{task}/load/mark", params={"state": "running"}).status_code == 422
    huge = {"state": "failed", "map_index": str(2**63)}
    assert operator.get(f"{task}/load/mark", params=huge).status_code == 422
    assert operator.get(f"{run_page('no-such-run')}/cancel").status_code == 404
    assert operator.post(f"{task}/nope/clear", data={"csrf_token": csrf}).status_code == 404
    assert operator.post("/dags/nope/pause", data={"csrf_token": csrf}).status_code == 404


def test_a_message_of_another_session_or_forged_is_not_shown(ui: ApiHarness) -> None:
    run_id = new_run(ui, {"extract": "failed"})
    operator, _ = logged_in(ui, "otto")
    _, location = confirm_and_post(operator, f"{run_page(run_id)}/tasks/extract/clear", {})
    cookie = operator.cookies.get("sluice_flash")
    assert cookie
    other, _ = logged_in(ui, "ada")
    other.cookies.set("sluice_flash", cookie)
    assert notice(other.get(location).text) is None
    other.cookies.set("sluice_flash", "SGVsbG8=.forged")
    assert notice(other.get(location).text) is None
    assert notice(operator.get(location).text) is not None


def test_the_dag_list_has_a_banner_and_the_import_errors_page_lists_the_file(
    ui: ApiHarness,
) -> None:
    viewer, _ = logged_in(ui, "vic")
    html = viewer.get("/dags").text
    assert 'data-testid="import-errors-banner"' in html
    assert '<a href="/import-errors">1 DAG file failed to parse</a>' in html
    page = viewer.get("/import-errors")
    assert page.status_code == 200
    assert 'data-file="' in page.text and "broken.py" in page.text
    assert 'data-testid="import-error-line">4<' in page.text
    assert "SyntaxError" in page.text
    assert "<script>alert(1)</script>" not in page.text  # escaped, never markup
