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

from tests.browser.conftest import record_screenshot
from tests.browser.engine import PASSWORD, running_ui_engine

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from playwright.sync_api import Browser, BrowserContext, Page

    from tests.browser.engine import UiEngine

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

#: Example DAGs the tests use (the engine is ready once these are parsed).
MANUAL_DAG: Final = "example_taskflow_branch"
WATCHED_DAG: Final = "process_region_eu"  # waits on region-eu, updated by a flag-file watcher
REPORT_PRODUCER: Final = "example_report_producer"
REPORT_CONSUMER: Final = "example_report_consumer"  # runs on daily_report | report_requested
WANTED: Final = {MANUAL_DAG, WATCHED_DAG, REPORT_PRODUCER, REPORT_CONSUMER}
RUN_DONE_S: Final = 120.0  # a run of six tasks on a loaded 2-core machine
PAGE_S: Final = 30.0


@pytest.fixture(scope="module")
def ui_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiEngine]:
    with running_ui_engine(tmp_path_factory.mktemp("ui"), WANTED) as engine:
        yield engine


@pytest.fixture
def context(browser: Browser, ui_engine: UiEngine) -> Iterator[BrowserContext]:
    ctx = browser.new_context(base_url=ui_engine.url, viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(PAGE_S * 1000)
    try:
        yield ctx
    finally:
        ctx.close()


def log_in(context: BrowserContext, username: str, next_path: str = "/") -> Page:
    page = context.new_page()
    page.goto(f"/login?next={next_path}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(re.escape(next_path) + r"$"))
    return page


def shoot(page: Page, folder: Path, name: str, *, docs_name: str | None = None) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    record_screenshot(path, docs_name=docs_name)


def test_a_visitor_is_sent_to_the_login_page_and_a_wrong_password_is_refused(
    context: BrowserContext,
) -> None:
    page = context.new_page()
    page.goto("/dags")
    expect(page).to_have_url(re.compile(r"/login\?next=/dags$"))
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Invalid username or password")


def test_why_for_a_dag_waiting_on_an_asset(context: BrowserContext, screenshot_dir: Path) -> None:
    page = log_in(context, "vic", f"/dags/{WATCHED_DAG}/why")
    expect(page.get_by_test_id("verdict")).to_contain_text("region-eu")
    condition = page.get_by_test_id("condition")
    expect(condition).to_contain_text("waiting for")
    expect(condition).to_contain_text("region-eu")
    watcher = page.locator('[data-watcher="eu-flag"]')
    expect(watcher).to_contain_text("DirectoryFileDeleteTrigger")
    expect(watcher).to_contain_text("triggerer")  # claimed by the engine's triggerer
    shoot(page, screenshot_dir, "why")
