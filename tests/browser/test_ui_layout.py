"""The web UI's layout in a real browser (Debian's Chromium through Playwright) against a real
``sluice run`` on the example DAGs: at 390 px (a phone) and at 1400 px no page is wider
than the window and the top bar's items all sit on the bar; long values (a 900 KB conf, an
event's extra with markup in it) stay in bounded boxes, shown once-escaped; the operator
column names the class.

One engine for the module, its own: the DAGs on ``region-us`` are paused first, so the big
run stays queued and the event starts nothing (no task process carries 900 KB around).
Screenshots of each page at each width are listed at the end of the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from engine.api.security import CSRF_HEADER
from tests.browser.engine import running_ui_engine
from tests.browser.pages import PAGE_S, csrf_of, log_in, shoot

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from playwright.sync_api import Browser, BrowserContext, Page

    from tests.browser.engine import UiEngine

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

#: Its operator class is defined in its DAG file: the operator column leaked that module.
DAG_ID: Final = "example_multiple_deferrals"
ASSET: Final = "region-us"
CONSUMERS: Final = (DAG_ID, "process_region_us")  # the DAGs on ASSET: paused first
#: A phone (390 px: an iPhone 12 to 15) and a desktop window.
VIEWPORTS: Final = {"phone": (390, 844), "desktop": (1400, 900)}
MARKUP: Final = "<script>alert('x')</script> & é"
CONF_BYTES: Final = 900_000
#: A value box's height at most: its max-height (16rem of 14 px), padding and borders.
BOX_MAX_HEIGHT_PX: Final = 17 * 14


def big_conf() -> dict[str, Any]:
    """About 900 KB of JSON: markup, many rows, and one long string without a break."""
    rows = [{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(2_000)]
    conf: dict[str, Any] = {"note": MARKUP, "rows": rows}
    conf["blob"] = "x" * (CONF_BYTES - len(json.dumps(conf)))
    return conf


@dataclass(frozen=True)
class World:
    """What the module made: the big run's page and the event with markup in its extra."""

    run_path: str
    event_id: int

    def pages(self) -> dict[str, str]:
        """Name -> path of each page the layout tests open."""
        return {
            "dag-list": "/dags",
            "dag": f"/dags/{DAG_ID}",
            "run": self.run_path,
            "task": f"{self.run_path}/tasks/process_items",
            "why": f"/dags/{DAG_ID}/why",
            "assets": "/assets",
            "asset": f"/assets/{ASSET}",
            "asset-graph": "/asset-graph",
            "triggers": "/triggers",
            "streams": "/streams",
            "engine": "/jobs",
        }


@pytest.fixture(scope="module")
def ui_engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[UiEngine]:
    root = tmp_path_factory.mktemp("ui-layout")
    with running_ui_engine(root, set(CONSUMERS), template=sqlite_template) as engine:
        yield engine


@pytest.fixture(scope="module")
def world(browser: Browser, ui_engine: UiEngine) -> World:
    """Through the REST API, as an operator's session: pause the DAGs on ASSET, trigger
    DAG_ID with a 900 KB conf, emit an event of ASSET whose extra holds markup."""
    context = browser.new_context(base_url=ui_engine.url)
    context.set_default_timeout(PAGE_S * 1000)
    try:
        headers = {CSRF_HEADER: csrf_of(log_in(context, "otto", "/dags"))}
        api = context.request
        for dag_id in CONSUMERS:
            paused = api.post(f"/api/v1/dags/{dag_id}/pause", headers=headers)
            assert paused.ok, paused.text()
        run = api.post(f"/api/v1/dags/{DAG_ID}/runs", headers=headers, data={"conf": big_conf()})
        assert run.status == 201, run.text()[:2000]
        extra = {"note": MARKUP, "path": "/a/long/path/without/spaces" * 40}
        event = api.post(
            "/api/v1/asset-events", headers=headers, data={"asset": ASSET, "extra": extra}
        )
        assert event.status == 201, event.text()
        run_path = f"/dags/{DAG_ID}/runs/{quote(run.json()['run_id'], safe='')}"
        return World(run_path, int(event.json()["event_id"]))
    finally:
        context.close()


@pytest.fixture(params=sorted(VIEWPORTS))
def sized(
    request: pytest.FixtureRequest, browser: Browser, ui_engine: UiEngine
) -> Iterator[tuple[str, BrowserContext]]:
    """A browser context of each width: ("phone" | "desktop", the context)."""
    width, height = VIEWPORTS[request.param]
    context = browser.new_context(
        base_url=ui_engine.url, viewport={"width": width, "height": height}
    )
    context.set_default_timeout(PAGE_S * 1000)
    try:
        yield request.param, context
    finally:
        context.close()


def overflow_px(page: Page) -> int:
    """How much wider than the window the page is (0: it fits)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def top_bar_items_off_the_bar(page: Page) -> list[str]:
    """The top bar's links, user and button that are hidden, or not inside the bar (its
    dark background) and the window: white on white, or out of reach."""
    return list(
        page.evaluate(
            """() => {
            const bar = document.querySelector('header.topbar').getBoundingClientRect();
            const items = document.querySelectorAll(
                'header.topbar a, header.topbar .user, header.topbar button');
            return [...items].filter(item => {
                const r = item.getBoundingClientRect();
                const inside = r.width > 0 && r.height > 0 && r.left >= bar.left
                    && r.right <= bar.right && r.top >= bar.top && r.bottom <= bar.bottom
                    && r.right <= window.innerWidth;
                return !inside;
            }).map(item => item.textContent.trim());
        }"""
        )
    )


def test_every_page_fits_the_window_with_its_top_bar_whole(
    sized: tuple[str, BrowserContext], world: World, screenshot_dir: Path
) -> None:
    size, context = sized
    page = log_in(context, "otto", "/dags")
    for name, path in world.pages().items():
        page.goto(path)
        expect(page.locator("main h1")).to_be_visible()
        expect(page.locator("header.topbar nav a").last).to_be_visible()
        assert overflow_px(page) <= 0, f"{name} at {size}: {overflow_px(page)} px too wide"
        assert top_bar_items_off_the_bar(page) == [], f"{name} at {size}"
        shoot(page, screenshot_dir, f"layout-{name}-{size}")


def test_a_900_kb_conf_stays_in_a_bounded_box_escaped_once(
    sized: tuple[str, BrowserContext], world: World
) -> None:
    size, context = sized
    page = log_in(context, "vic", "/dags")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(world.run_path)
    box = page.get_by_test_id("run-conf")
    expect(box).to_contain_text(MARKUP)  # the markup as text: escaped once, not \u003c
    expect(page.locator("dd .left-out")).to_contain_text("more characters")
    height, scrolled, right = box.evaluate(
        "b => [b.getBoundingClientRect().height, b.scrollHeight, b.getBoundingClientRect().right]"
    )
    assert height <= BOX_MAX_HEIGHT_PX < scrolled, (size, height, scrolled)  # scrolls inside
    assert right <= VIEWPORTS[size][0], (size, right)
    operator = page.get_by_test_id("task-instances").locator(
        'tr[data-task="process_items"] code.classname'
    )
    expect(operator).to_have_text("ProcessItemsOneByOne")
    hover = operator.get_attribute("title") or ""
    assert "example_multiple_deferrals" in hover and "sluice_dag_" in hover, hover
    assert dialogs == []  # no script of the conf ran


def test_an_events_extra_with_markup_shows_as_text(
    sized: tuple[str, BrowserContext], world: World
) -> None:
    size, context = sized
    page = log_in(context, "vic", f"/assets/{ASSET}")
    extra = page.locator(f"#event-{world.event_id} pre.value")
    expect(extra).to_contain_text(MARKUP)
    expect(extra).to_contain_text('"path": "/a/long/path')
    right = extra.evaluate("b => b.getBoundingClientRect().right")
    if size == "desktop":  # a phone scrolls the events table inside its own box
        assert right <= VIEWPORTS[size][0]
    assert overflow_px(page) <= 0
