"""The UI's actions and import errors in a real browser (Debian's Chromium through
Playwright) against a real ``sluice run``: mark success / failed, clear, cancel a run,
pause / unpause, each through its confirmation page to the message of what changed; the DAG
list's banner for a DAG file that fails to parse and the page that lists it. At 1400 px and
at 390 px (no page wider than the window), with a screenshot of each page.

The engine's dags folder holds one example DAG and one broken file. The actions work on
runs of that DAG while it is paused (the ``paused_run`` fixture): their task instances then
stay where the test put them, so what a confirmation lists is known; the scheduler's side
of each action is tested in ``tests/integration/test_operator_actions.py``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import pytest
from playwright.sync_api import expect
from sqlalchemy import select, update

from engine.db.models import DagParseError, DagRun, TaskInstance, utcnow
from engine.db.queries import dags as dags_sql
from engine.views import operations
from tests.browser.engine import dags_folder, running_ui_engine
from tests.browser.pages import PAGE_S, log_in, shoot
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from playwright.sync_api import BrowserContext, Page

    from tests.browser.engine import UiEngine

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

DAG: Final = "example_taskflow_branch"
BROKEN: Final = "from engine import DAG\n\n\ndef broken(:\n    pass\n"
WIDE: Final = {"width": 1400, "height": 900}
VIEWPORT: Final = WIDE  # of the context fixture (conftest)
PHONE: Final = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def ui_engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[UiEngine]:
    root = tmp_path_factory.mktemp("ui-actions")
    dags = dags_folder(root, [f"{DAG}.py"], {"broken.py": BROKEN})
    with running_ui_engine(root, {DAG}, template=sqlite_template, dags=dags) as engine:
        wait_for(
            lambda: engine.db.call(lambda s: s.execute(select(DagParseError.fileloc)).first()),
            timeout=PAGE_S,
            what="the broken DAG file's parse error",
            step=0.2,
        )
        yield engine


@pytest.fixture
def paused_run(ui_engine: UiEngine) -> str:
    """A new manual run of the DAG, paused: the run waits in the queue, its task instances
    stay as the test sets them."""

    def make(session: Any) -> str:
        dags_sql.set_paused(session, dag_id=DAG, paused=True)
        made = operations.trigger_dag(session, DAG, conf=None, logical_date=None, now=utcnow())
        return str(made["run_id"])

    run_id: str = ui_engine.db.call(make)
    return run_id


def set_states(engine: UiEngine, run_id: str, states: dict[str, str]) -> None:
    run_pk = select(DagRun.id).where(DagRun.run_id == run_id).scalar_subquery()
    for task_id, state in states.items():
        change = (
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == run_pk, TaskInstance.task_id == task_id)
            .values(state=state, try_number=1)
        )
        engine.db.call(lambda s, c=change: s.execute(c))


_WIDTHS: Final = """(selector) => {
  const box = document.querySelector(selector);
  const wider = [...box.querySelectorAll("*")]
    .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5)
    .slice(0, 5)
    .map((e) => e.tagName + "." + e.className);
  return {right: box.getBoundingClientRect().right, scroll: box.scrollWidth,
          client: box.clientWidth, window: window.innerWidth, wider: wider};
}"""


def fits(page: Page, selector: str) -> None:
    """No horizontal overflow in what ``selector`` shows: it ends inside the window and
    nothing in it sticks out (its own boxes scroll inside themselves); nor is the whole
    document wider than the window."""
    seen = page.evaluate(_WIDTHS, selector)
    assert seen["right"] <= seen["window"] + 0.5, (page.url, selector, seen)
    assert seen["scroll"] <= seen["client"] + 1, (page.url, selector, seen)
    assert not seen["wider"], (page.url, selector, seen)
    doc = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert doc[0] <= doc[1], f"{page.url}: the document is {doc[0]} px wide in {doc[1]} px"


def on_a_phone(page: Page, folder: Path, name: str, selector: str = "main") -> None:
    """The page again at 390 px: ``selector`` fits, and a screenshot; then 1400 px again."""
    page.set_viewport_size(PHONE)
    fits(page, selector)
    shoot(page, folder, f"{name}-390")
    page.set_viewport_size(WIDE)


def affected(page: Page) -> list[str]:
    """The task ids the confirmation page lists, once it has loaded (the click before
    navigates: read at once, the rows would be the old page's none)."""
    table = page.get_by_test_id("affected")
    expect(table).to_be_visible()
    rows = table.locator("tbody tr")
    return [str(r.get_attribute("data-task")) for r in rows.all()]


def notice(page: Page) -> Any:
    return page.locator('p.notice[role="status"]')


def task_page(run_id: str, task_id: str) -> str:
    return f"/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/{task_id}"


def open_as(context: BrowserContext, username: str, path: str) -> Page:
    page = log_in(context, username, "/dags")
    page.goto(path)
    return page


def test_mark_success_downstream_and_failed_upstream_from_the_task_page(
    context: BrowserContext, paused_run: str, screenshot_dir: Path
) -> None:
    page = open_as(context, "otto", task_page(paused_run, "big_day"))
    actions = page.get_by_test_id("task-actions")
    mark = actions.locator('form[aria-label="mark"]')
    mark.get_by_label("with downstream").check()
    shoot(page, screenshot_dir, "task-actions")
    on_a_phone(page, screenshot_dir, "task-actions", '[data-testid="task-actions"]')
    mark.get_by_role("button", name="Mark success…").click()
    expect(page.locator("h1")).to_have_text("Mark big_day success?")
    assert affected(page) == ["archive", "big_day", "report"]
    shoot(page, screenshot_dir, "confirm-mark-success")
    on_a_phone(page, screenshot_dir, "confirm-mark-success")
    page.get_by_test_id("confirm").get_by_role("button", name=re.compile("^Mark 3")).click()
    expect(notice(page)).to_have_text("Marked 3 task instances success: archive, big_day, report.")
    expect(page.get_by_test_id("task-state").locator('[data-state="success"]')).to_be_visible()
    shoot(page, screenshot_dir, "task-marked-success")
    page.reload()
    expect(notice(page)).to_have_count(0)  # said once

    page.goto(task_page(paused_run, "summarize"))
    mark = page.get_by_test_id("task-actions").locator('form[aria-label="mark"]')
    mark.get_by_label("with upstream").check()
    mark.get_by_role("button", name="Mark failed…").click()
    assert affected(page) == ["extract", "summarize"]
    page.get_by_test_id("confirm").get_by_role("button", name=re.compile("^Mark 2")).click()
    expect(notice(page)).to_have_text("Marked 2 task instances failed: extract, summarize.")
    expect(page.get_by_test_id("task-state").locator('[data-state="failed"]')).to_be_visible()


def test_clear_with_options_from_the_task_page_and_the_failed_tasks_of_a_run(
    context: BrowserContext, ui_engine: UiEngine, paused_run: str, screenshot_dir: Path
) -> None:
    set_states(
        ui_engine,
        paused_run,
        {"extract": "success", "summarize": "failed", "choose": "upstream_failed"},
    )
    page = open_as(context, "otto", task_page(paused_run, "summarize"))
    clear = page.get_by_test_id("task-actions").locator('form[aria-label="clear"]')
    clear.get_by_label("with downstream").check()
    clear.get_by_label("only failed").check()
    clear.get_by_role("button", name="Clear…").click()
    assert affected(page) == ["choose", "summarize"]
    shoot(page, screenshot_dir, "confirm-clear")
    page.get_by_test_id("confirm").get_by_role("button", name="Clear 2 task instances").click()
    expect(notice(page)).to_have_text(
        "Cleared 2 task instances: choose, summarize; they run again."
    )

    set_states(ui_engine, paused_run, {"archive": "failed"})
    page.get_by_role("link", name=paused_run, exact=True).click()  # the run page
    page.get_by_test_id("run-actions").get_by_role("link", name="Clear failed tasks…").click()
    assert affected(page) == ["archive"]
    page.get_by_test_id("confirm").get_by_role("button", name="Clear 1 task instance").click()
    expect(notice(page)).to_have_text("Cleared 1 task instance: archive; they run again.")
    tasks = page.get_by_test_id("task-instances")
    expect(tasks.locator('tr[data-task="archive"] [data-state="none"]')).to_be_visible()
    shoot(page, screenshot_dir, "run-cleared")


def test_cancel_a_run_from_its_page(
    context: BrowserContext, ui_engine: UiEngine, paused_run: str, screenshot_dir: Path
) -> None:
    set_states(ui_engine, paused_run, {"extract": "success"})
    page = open_as(context, "ada", task_page(paused_run, "extract"))
    page.get_by_role("link", name=paused_run, exact=True).click()
    page.get_by_test_id("run-actions").get_by_role("link", name="Cancel run…").click()
    expect(page.locator("h1")).to_have_text(f"Cancel run {paused_run}?")
    pending = ["archive", "big_day", "choose", "quiet_day", "report", "summarize"]
    assert affected(page) == pending  # extract already ended
    shoot(page, screenshot_dir, "confirm-cancel")
    on_a_phone(page, screenshot_dir, "confirm-cancel")
    page.get_by_test_id("confirm").get_by_role("button", name=re.compile("^Cancel the run")).click()
    expect(notice(page)).to_have_text(
        f"Cancelled run {paused_run}: it is failed. 6 task instances skipped: {', '.join(pending)}."
    )
    expect(page.get_by_test_id("run-state").locator('[data-state="failed"]')).to_be_visible()
    expect(page.get_by_role("link", name="Cancel run…")).to_have_count(0)
    shoot(page, screenshot_dir, "run-cancelled")


def test_unpause_and_pause_from_the_dag_page(
    context: BrowserContext, paused_run: str, screenshot_dir: Path
) -> None:
    page = open_as(context, "otto", f"/dags/{DAG}")
    page.get_by_role("link", name="Unpause…").click()
    expect(page.locator("h1")).to_have_text(f"Unpause {DAG}?")
    on_a_phone(page, screenshot_dir, "confirm-unpause")
    page.get_by_role("button", name=f"Unpause {DAG}").click()
    expect(notice(page)).to_have_text(f"Unpaused {DAG}: the scheduler runs it again.")
    page.get_by_role("link", name="Pause…").click()
    expect(page.get_by_test_id("confirm")).to_contain_text("waits in the queue")
    page.get_by_role("button", name=f"Pause {DAG}").click()
    expect(notice(page)).to_have_text(f"Paused {DAG}: the scheduler starts nothing of it.")
    expect(page.locator("h1")).to_contain_text("paused")
    shoot(page, screenshot_dir, "dag-paused")


def test_the_import_errors_banner_and_page(context: BrowserContext, screenshot_dir: Path) -> None:
    page = log_in(context, "vic", "/dags")
    banner = page.get_by_test_id("import-errors-banner")
    expect(banner).to_have_text(re.compile(r"^1 DAG file failed to parse"))
    shoot(page, screenshot_dir, "dag-list-import-errors")
    on_a_phone(
        page, screenshot_dir, "dag-list-import-errors", '[data-testid="import-errors-banner"]'
    )
    banner.get_by_role("link").click()
    expect(page).to_have_url(re.compile(r"/import-errors$"))
    error = page.get_by_test_id("import-error")
    expect(error).to_have_count(1)
    expect(error.locator("h2")).to_contain_text("broken.py")
    expect(page.get_by_test_id("import-error-line")).to_have_text("4")
    expect(page.get_by_test_id("import-error-message")).to_contain_text("SyntaxError")
    error.get_by_text("Stack trace").click()
    expect(page.get_by_test_id("import-error-trace")).to_be_visible()
    shoot(page, screenshot_dir, "import-errors")
    on_a_phone(page, screenshot_dir, "import-errors")
    # a viewer sees no action anywhere
    page.goto(f"/dags/{DAG}")
    expect(page.get_by_role("link", name="Pause…")).to_have_count(0)
    expect(page.get_by_role("link", name="Unpause…")).to_have_count(0)
