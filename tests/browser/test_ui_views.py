"""The task graph, Gantt, code, results and trigger-form pages in a real browser (Debian's
Chromium through Playwright) against a real ``sluice run`` on the example DAGs, each at a
desktop width (1400 px) and a phone width (390 px, where no page may be wider than the
window).

One engine for the module (``ui_engine``) and one finished run of
``example_params_and_groups`` (``finished_run``, triggered by the CLI) that the read-only
views show; the params-form test makes its own run through the form. Screenshots of each
page at both widths go under pytest's temporary folder, listed at the end of the run; the
graph's desktop one is also the README's ``docs/ui-graph.png`` when asked.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

import pytest
from playwright.sync_api import expect
from sqlalchemy import select

from engine.db.models import DagRun
from tests.browser.engine import running_ui_engine
from tests.browser.pages import log_in, shoot
from tests.cli import invoke
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from playwright.sync_api import BrowserContext, Page

    from tests.browser.engine import UiEngine

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

DAG: Final = "example_params_and_groups"
WIDTHS: Final = (1400, 390)
RUN_DONE_S: Final = 120.0  # six small tasks on a loaded 2-core machine
VIEWPORT: Final = {"width": 1400, "height": 900}  # of the context fixture (conftest)
#: The outermost elements of the page's content sticking out of the window, but those
#: inside a box that scrolls (a graph, a table of code): what would widen the page.
_WIDE_ELEMENTS: Final = """(width) => {
  const scrolls = (e) => ["auto", "scroll", "hidden"].includes(getComputedStyle(e).overflowX);
  const boxed = (e) => { for (let a = e.parentElement; a; a = a.parentElement) {
    if (scrolls(a)) return true; } return false; };
  const out = (e) => e.getBoundingClientRect().right > width + 1;
  return [...document.querySelectorAll("main *")]
    .filter((e) => out(e) && !out(e.parentElement) && !boxed(e))
    .slice(0, 5).map((e) => e.tagName + "." + e.getAttribute("class") + " "
      + Math.round(e.getBoundingClientRect().right) + "px");
}"""


@pytest.fixture(scope="module")
def ui_engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[UiEngine]:
    with running_ui_engine(
        tmp_path_factory.mktemp("ui-views"), {DAG}, template=sqlite_template
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def finished_run(ui_engine: UiEngine) -> str:
    """A run of the DAG with its default params, triggered as ``sluice dags trigger`` does,
    once it succeeded."""
    done = invoke("dags", "trigger", DAG, "--conf", '{"region": "us"}', env=ui_engine.env)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().split()[-1]
    state = select(DagRun.state).where(DagRun.dag_id == DAG, DagRun.run_id == run_id)

    def ended() -> str | None:
        found = ui_engine.db.call(lambda s: s.execute(state).scalar())
        return found if found in ("success", "failed") else None

    final = wait_for(ended, timeout=RUN_DONE_S, what=f"run {run_id} to end", step=0.3)
    assert final == "success", ui_engine.log.read_text(errors="replace")[-3000:]
    return run_id


def at_width(page: Page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})


def fits(page: Page, width: int) -> None:
    """No horizontal overflow of the page's content: nothing in ``main`` is wider than the
    window but inside a box of its own that scrolls, and the document is no wider than the
    window."""
    wide = page.evaluate(_WIDE_ELEMENTS, width)
    assert not wide, f"{page.url} sticks out of a {width} px window: {wide}"
    main = page.evaluate("document.querySelector('main').getBoundingClientRect().right")
    assert main <= width + 1, f"{page.url}: main ends at {main} px in a {width} px window"
    doc = page.evaluate("document.documentElement.scrollWidth")
    assert doc <= width, f"{page.url}: the document is {doc} px wide in a {width} px window"


def run_path(run_id: str) -> str:
    return f"/dags/{DAG}/runs/{quote(run_id, safe='')}"


def test_the_graph_shows_labels_states_and_a_group_folded_and_unfolded(
    context: BrowserContext, finished_run: str, screenshot_dir: Path
) -> None:
    page = log_in(context, "vic", f"/dags/{DAG}/graph")
    for width in WIDTHS:
        at_width(page, width)
        page.goto(f"/dags/{DAG}/graph")
        graph = page.get_by_test_id("task-graph")
        for task_id in ("plan", "check", "skip_load", "load.stage", "load.publish"):
            expect(graph.locator(f'[data-kind="task"][data-id="{task_id}"]')).to_be_visible()
        expect(graph.locator('[data-id="plan"]')).to_have_attribute("data-state", "success")
        expect(graph.locator('[data-id="skip_load"]')).to_have_attribute("data-state", "skipped")
        label = graph.locator('.edge-label[data-source="check"][data-target="load.stage"]')
        expect(label).to_have_text("load the data")
        expect(page.get_by_test_id("graph-run-state")).to_contain_text("success")
        fits(page, width)
        docs = "ui-graph.png" if width == WIDTHS[0] else None
        shoot(page, screenshot_dir, f"views-graph-{width}", docs_name=docs)
        page.get_by_test_id("task-groups").locator('[data-group="load"]').click()
        folded = graph.locator('[data-kind="group"][data-id="load"]')
        expect(folded).to_be_visible()
        expect(folded).to_have_attribute("data-state", "success")
        expect(graph.locator('[data-id="load.stage"]')).to_have_count(0)
        expect(graph.locator('.edge-label[data-target="load"]')).to_have_text("load the data")
        fits(page, width)
        shoot(page, screenshot_dir, f"views-graph-folded-{width}")
        folded.click()  # a folded group's node unfolds it
        expect(graph.locator('[data-id="load.stage"]')).to_be_visible()
    graph.locator('[data-id="plan"]').click()  # a task's node opens its task instance
    expect(page).to_have_url(re.compile(r"/tasks/plan$"))
    expect(page.get_by_test_id("task-state").locator('[data-state="success"]')).to_be_visible()


def test_the_gantt_chart_of_a_finished_run(
    context: BrowserContext, finished_run: str, screenshot_dir: Path
) -> None:
    page = log_in(context, "vic", run_path(finished_run))
    page.get_by_test_id("run-tabs").get_by_role("link", name="Gantt").click()
    expect(page).to_have_url(re.compile(r"/gantt$"))
    for width in WIDTHS:
        at_width(page, width)
        page.reload()
        gantt = page.get_by_test_id("gantt")
        plan = gantt.locator('a.bar[data-task="plan"]')
        expect(plan).to_have_attribute("data-state", "success")
        expect(plan.locator("rect.run")).to_have_count(1)
        expect(gantt.locator('a.bar[data-task="skip_load"] rect.run')).to_have_count(0)
        expect(gantt.locator(".gantt-names")).to_contain_text("load.publish")
        fits(page, width)
        shoot(page, screenshot_dir, f"views-gantt-{width}")


def test_the_code_page_shows_the_source_and_the_docs(
    context: BrowserContext, screenshot_dir: Path
) -> None:
    page = log_in(context, "vic", f"/dags/{DAG}")
    page.get_by_test_id("dag-tabs").get_by_role("link", name="Code").click()
    for width in WIDTHS:
        at_width(page, width)
        page.reload()
        expect(page.get_by_test_id("doc-md")).to_contain_text("# Params and groups")
        source = page.get_by_test_id("source")
        expect(source).to_contain_text('with TaskGroup("load") as load:')
        expect(source.locator("#L1 td.lineno")).to_have_text("1")
        fits(page, width)
        shoot(page, screenshot_dir, f"views-code-{width}")


def test_the_results_of_a_task(
    context: BrowserContext, finished_run: str, screenshot_dir: Path
) -> None:
    page = log_in(context, "vic", f"{run_path(finished_run)}/tasks/plan")
    page.get_by_role("link", name="Results", exact=True).click()
    for width in WIDTHS:
        at_width(page, width)
        page.reload()
        result = page.get_by_test_id("results").locator('pre[data-key="return_value"]')
        expect(result).to_contain_text('"region": "us"')
        expect(result).to_contain_text('"batch_size": 100')
        fits(page, width)
        shoot(page, screenshot_dir, f"views-results-{width}")


def test_the_params_form_shows_an_error_next_to_its_field_then_creates_the_run(
    context: BrowserContext, ui_engine: UiEngine, screenshot_dir: Path
) -> None:
    page = log_in(context, "otto", f"/dags/{DAG}/trigger")
    for width in WIDTHS:
        at_width(page, width)
        page.goto(f"/dags/{DAG}/trigger")
        form = page.get_by_test_id("trigger-form")
        expect(form.get_by_label("batch_size")).to_have_value("100")
        expect(form.get_by_label("mode")).to_have_value('"append"')
        fits(page, width)
        shoot(page, screenshot_dir, f"views-trigger-form-{width}")
    form.get_by_label("batch_size").fill("0")
    form.get_by_label("region").fill("apac")
    form.get_by_role("button", name="Review the run…").click()
    field = page.locator('[data-param="batch_size"]')
    expect(field.get_by_test_id("param-error")).to_contain_text("less than the minimum 1")
    expect(page.locator('[data-param="region"] [data-testid="param-error"]')).to_have_count(0)
    expect(field.get_by_label("batch_size")).to_have_value("0")  # what was typed is kept
    expect(page.get_by_label("region")).to_have_value("apac")
    fits(page, WIDTHS[-1])
    shoot(page, screenshot_dir, "views-trigger-error-390")
    page.get_by_label("batch_size").fill("50")
    page.get_by_label("mode").select_option(label="replace")
    page.get_by_label("dry_run").check()
    page.get_by_role("button", name="Review the run…").click()
    shown = page.get_by_test_id("confirm-conf")
    expect(shown).to_contain_text('"batch_size": 50')
    expect(shown).to_contain_text('"mode": "replace"')
    fits(page, WIDTHS[-1])
    shoot(page, screenshot_dir, "views-trigger-confirm-390")
    page.get_by_role("button", name="Create the run").click()
    expect(page).to_have_url(re.compile(rf"/dags/{DAG}/runs/manual__"))
    facts = page.locator("dl.facts")
    for piece in ('"batch_size": 50', '"dry_run": true', '"region": "apac"'):
        expect(facts).to_contain_text(piece)
