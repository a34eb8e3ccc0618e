"""The web UI in a real browser (Debian's Chromium through Playwright) against a real
``sluice run`` on the example DAGs: what an operator does on a first visit.

One engine for the module (``ui_engine``); each test opens its own browser context (its
own cookies). Waits are on what the page shows, bounded; the run pages reload themselves
while something is still going on. Screenshots of each main page are saved under pytest's
temporary folder and listed at the end of the run.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

import pytest
from playwright.sync_api import expect

from engine.api.security import CSRF_HEADER
from tests.browser.engine import PASSWORD, running_ui_engine
from tests.browser.pages import PAGE_S, csrf_of, log_in, shoot

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from playwright.sync_api import BrowserContext, Route

    from tests.browser.engine import UiEngine

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

#: Example DAGs the tests use (the engine is ready once these are parsed).
MANUAL_DAG: Final = "example_taskflow_branch"
WATCHED_DAG: Final = "process_region_eu"  # waits on region-eu, updated by a flag-file watcher
REPORT_PRODUCER: Final = "example_report_producer"
REPORT_CONSUMER: Final = "example_report_consumer"  # runs on daily_report | report_requested
WANTED: Final = {MANUAL_DAG, WATCHED_DAG, REPORT_PRODUCER, REPORT_CONSUMER}
RUN_DONE_S: Final = 120.0  # a run of six tasks on a loaded 2-core machine


@pytest.fixture(scope="module")
def ui_engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[UiEngine]:
    with running_ui_engine(
        tmp_path_factory.mktemp("ui"), WANTED, template=sqlite_template
    ) as engine:
        yield engine


def test_log_in_and_see_the_example_dags(context: BrowserContext, screenshot_dir: Path) -> None:
    page = context.new_page()
    page.goto("/dags")
    expect(page).to_have_url(re.compile(r"/login\?next=/dags$"))
    shoot(page, screenshot_dir, "login")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Invalid username or password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/dags$"))
    dag_list = page.get_by_test_id("dag-list")
    for dag_id in sorted(WANTED):
        expect(dag_list.locator(f'tr[data-dag="{dag_id}"]')).to_be_visible()
    producer = dag_list.locator(f'tr[data-dag="{REPORT_PRODUCER}"]')
    expect(producer).to_contain_text("*/2 * * * *")
    expect(dag_list.locator(f'tr[data-dag="{WATCHED_DAG}"]')).to_contain_text("assets region-eu")
    expect(page.locator("header")).to_contain_text("ada (admin)")
    shoot(page, screenshot_dir, "dag-list")


def test_trigger_a_dag_watch_its_run_turn_green_and_read_a_task_log(
    context: BrowserContext, screenshot_dir: Path
) -> None:
    page = log_in(context, "otto", "/dags")
    # Paused until the last task's page is open: a run of six quick tasks could otherwise
    # reach it before the page does, and the page would load its log whole, not follow it.
    api, headers = page.request, {CSRF_HEADER: csrf_of(page)}
    assert api.post(f"/api/v1/dags/{MANUAL_DAG}/pause", headers=headers).ok
    row = page.locator(f'tr[data-dag="{MANUAL_DAG}"]')
    row.get_by_text("Trigger…").click()
    row.get_by_label("conf").fill('{"threshold": 10}')
    row.get_by_role("button", name=f"Trigger {MANUAL_DAG}").click()
    expect(page.get_by_test_id("confirm-conf")).to_contain_text('"threshold": 10')
    page.get_by_role("button", name="Create the run").click()
    expect(page).to_have_url(re.compile(rf"/dags/{MANUAL_DAG}/runs/manual__"))
    run_url = page.url
    expect(page.locator("dl.facts")).to_contain_text('{"threshold": 10}')
    # open the last task before it starts: its page follows the log as the try writes it
    streamed: list[str] = []

    def record_tail(route: Route) -> None:  # the answers of the page's log tail, as they pass
        answer = route.fetch()
        if answer.ok:
            streamed.append(answer.json()["text"])
        route.fulfill(response=answer)

    page.route("**/tasks/archive/log?*", record_tail)
    tasks = page.get_by_test_id("task-instances")
    tasks.locator('tr[data-task="archive"]').get_by_role("link", name="archive").click()
    expect(page.get_by_test_id("log")).to_be_attached()
    assert api.post(f"/api/v1/dags/{MANUAL_DAG}/unpause", headers=headers).ok
    expect(page.get_by_test_id("task-state").locator('[data-state="success"]')).to_be_visible(
        timeout=RUN_DONE_S * 1000
    )
    log = page.get_by_test_id("log")
    expect(log).to_contain_text("archiving")
    expect(log).to_contain_text("3 orders")
    assert any("archive run" in text for text in streamed), streamed  # the tail carried it
    shoot(page, screenshot_dir, "task-log")
    page.goto(run_url)  # the run page reloads itself while the run goes on
    expect(page.get_by_test_id("run-state").locator('[data-state="success"]')).to_be_visible(
        timeout=RUN_DONE_S * 1000
    )
    tasks = page.get_by_test_id("task-instances")
    expect(tasks.locator('tr[data-task="big_day"]')).to_contain_text("success")
    expect(tasks.locator('tr[data-task="quiet_day"]')).to_contain_text("skipped")
    shoot(page, screenshot_dir, "run")
    page.get_by_role("link", name=MANUAL_DAG).first.click()
    grid = page.get_by_test_id("runs-grid")
    expect(grid.locator('tr[data-task="archive"] [data-state="success"]').first).to_be_visible()
    shoot(page, screenshot_dir, "runs-grid")
    page.get_by_role("link", name="DAGs", exact=True).click()
    expect(page.locator(f'tr[data-dag="{MANUAL_DAG}"] [data-testid="paused"]')).to_be_visible()
    shoot(page, screenshot_dir, "dag-list-after-a-run", docs_name="ui-dag-list.png")


def test_emit_an_asset_event_and_see_the_downstream_run_appear(
    context: BrowserContext, screenshot_dir: Path
) -> None:
    page = log_in(context, "otto", "/assets")
    listed = page.get_by_test_id("asset-list").locator('tr[data-asset="daily_report"]')
    expect(listed).to_contain_text(f"{REPORT_PRODUCER}/build_report")
    expect(listed).to_contain_text(REPORT_CONSUMER)
    shoot(page, screenshot_dir, "asset-list")
    listed.get_by_role("link", name="daily_report").click()
    expect(page).to_have_url(re.compile(r"/assets/daily_report$"))
    page.get_by_text("Emit an event…").click()
    page.get_by_label("extra").fill('{"rows": 12, "from": "the browser test"}')
    page.get_by_role("button", name="Emit an event of daily_report").click()
    expect(page).to_have_url(re.compile(r"/assets/daily_report\?emitted=\d+#event-\d+$"))
    new = page.locator("tr.new")
    expect(new).to_contain_text("api")
    expect(new).to_contain_text("ui:otto")
    expect(new).to_contain_text('"from": "the browser test"')
    # the page reloads itself until the run the event triggered shows up
    run_link = new.locator(f'a[href^="/dags/{REPORT_CONSUMER}/runs/"]')
    expect(run_link).to_be_visible(timeout=RUN_DONE_S * 1000)
    shoot(page, screenshot_dir, "asset-events")
    run_link.click()
    expect(page.locator("dl.facts")).to_contain_text("daily_report event")
    expect(page.get_by_test_id("run-state").locator('[data-state="success"]')).to_be_visible(
        timeout=RUN_DONE_S * 1000
    )


def test_open_the_asset_graph(context: BrowserContext, screenshot_dir: Path) -> None:
    page = log_in(context, "vic", "/asset-graph")
    graph = page.get_by_test_id("asset-graph")
    for kind, node in [
        ("watcher", "watcher:region-eu/eu-flag"),
        ("asset", "asset:region-eu"),
        ("dag", f"dag:{WATCHED_DAG}"),
        ("task", f"task:{REPORT_PRODUCER}/build_report"),
        ("asset", "asset:daily_report"),
        ("dag", f"dag:{REPORT_CONSUMER}"),
    ]:
        expect(graph.locator(f'[data-kind="{kind}"][data-id="{node}"]')).to_be_visible()
    edge = f'[data-source="asset:daily_report"][data-target="dag:{REPORT_CONSUMER}"]'
    expect(graph.locator(edge)).to_have_count(1)
    shoot(page, screenshot_dir, "asset-graph")
    graph.locator('[data-id="asset:region-eu"]').click()
    expect(page).to_have_url(re.compile(r"/assets/region-eu$"))
    expect(page.locator("h1")).to_have_text("region-eu")


def test_why_for_a_dag_waiting_on_an_asset(context: BrowserContext, screenshot_dir: Path) -> None:
    page = log_in(context, "vic", f"/dags/{WATCHED_DAG}/why")
    expect(page.get_by_test_id("verdict")).to_contain_text("region-eu")
    condition = page.get_by_test_id("condition")
    expect(condition).to_contain_text("waiting for")
    expect(condition).to_contain_text("region-eu")
    watcher = page.locator('[data-watcher="eu-flag"]')
    expect(watcher).to_contain_text("DirectoryFileDeleteTrigger")
    # claimed by the engine's triggerer (the page reloads itself until it shows)
    expect(watcher).to_contain_text("alive", timeout=PAGE_S * 2000)
    shoot(page, screenshot_dir, "why")


def test_triggers_by_triggerer_and_shared_stream_lag(
    context: BrowserContext, screenshot_dir: Path
) -> None:
    page = log_in(context, "vic", "/triggers")
    live = page.locator("section.triggerer").filter(has_text="alive").first
    expect(live).to_contain_text("DirectoryFileDeleteTrigger")
    expect(live).to_contain_text("region-eu")
    shoot(page, screenshot_dir, "triggers")
    page.get_by_role("link", name="Shared streams").click()
    group = page.locator("tr[data-stream]").filter(has_text="directory-scan").first
    expect(group).to_be_visible(timeout=PAGE_S * 2000)
    expect(group.locator('td[data-col="broker"]')).to_have_text("directory-scan")
    expect(group.locator('td[data-col="dead_lettered"]')).to_have_text("0")
    # the two inbox watchers share one listing; the backlog's sparkline needs two samples
    expect(group.locator("svg.spark")).to_be_visible(timeout=PAGE_S * 2000)
    shoot(page, screenshot_dir, "streams")


def test_the_engine_page_shows_each_part_alive(
    context: BrowserContext, screenshot_dir: Path
) -> None:
    page = log_in(context, "vic", "/triggers")
    page.get_by_role("link", name="Engine").click()
    expect(page.locator("h1")).to_contain_text("Engine parts")
    parts = page.get_by_test_id("parts")
    for part in ("scheduler", "executor", "triggerer", "dag_processor", "api"):
        row = parts.locator(f'tr[data-part="{part}"]').filter(has_text="alive").first
        expect(row).to_be_visible()
    # the local executor: no Celery section
    expect(page.get_by_test_id("workers")).to_have_count(0)
    shoot(page, screenshot_dir, "engine")


def test_a_viewer_sees_no_action_and_a_forged_post_is_refused(
    context: BrowserContext, ui_engine: UiEngine
) -> None:
    page = log_in(context, "vic", "/dags")
    row = page.locator(f'tr[data-dag="{MANUAL_DAG}"]')
    expect(row).to_be_visible()
    actions = 'form[method="post"]:not([action="/logout"])'
    for path in ("/dags", f"/dags/{MANUAL_DAG}", "/assets/daily_report"):
        page.goto(path)
        expect(page.locator("main h1")).to_be_visible()
        expect(page.locator(actions)).to_have_count(0)
        for label in ("Pause", "Unpause", "Trigger…", "Clear", "Emit an event…"):
            expect(page.get_by_text(label, exact=True)).to_have_count(0)
    # a viewer's own session and token still cannot act
    refused = context.request.post(
        f"/dags/{MANUAL_DAG}/pause", form={"csrf_token": csrf_of(page)}, max_redirects=0
    )
    assert refused.status == 403, refused.text()
    # an operator's session without the form's CSRF token (a forged cross-site post)
    admin = log_in(context.browser.new_context(base_url=ui_engine.url), "ada", "/dags")
    forged = admin.context.request.post(f"/dags/{MANUAL_DAG}/pause", form={}, max_redirects=0)
    assert forged.status == 403 and "CSRF" in forged.text()
    wrong = admin.context.request.post(
        f"/dags/{MANUAL_DAG}/pause", form={"csrf_token": "forged"}, max_redirects=0
    )
    assert wrong.status == 403
    admin.goto("/dags")
    expect(admin.locator(f'tr[data-dag="{MANUAL_DAG}"] [data-testid="paused"]')).to_have_text(
        "active"
    )
    admin.context.close()
