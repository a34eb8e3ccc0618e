"""Browser tests: Debian's Chromium driven by Playwright against a real ``sluice run``.

One engine per test module (started once, shared by its tests: engine start-ups are what
cost time), on the example DAGs of ``dags/`` with a fresh ``SLUICE_HOME`` and a copy of the
migrated template database, the API/UI on a free loopback port, and one user per role made
with ``sluice users create`` (run in process, ``tests/cli.py``). Screenshots of the pages go
under pytest's temporary folder; their paths are printed at the end of the run (and as each
is taken, with ``-s``).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import pytest
from playwright.sync_api import sync_playwright

from tests.browser.chromium import LAUNCH_ARGS, ChromiumUnavailableError, ensure_chromium
from tests.browser.pages import PAGE_S
from tests.browser.screenshots import drain
from tests.reporting import SCREENSHOT_PROPERTY

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from playwright.sync_api import Browser, BrowserContext

    from tests.browser.engine import UiEngine


@pytest.fixture(scope="session")
def chromium_executable() -> Path:
    try:
        return ensure_chromium()
    except ChromiumUnavailableError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def browser(chromium_executable: Path) -> Iterator[Browser]:
    """One Chromium per test module, stopped with it.

    Never longer: between its calls Playwright's sync API marks its own event loop as
    the thread's running loop, so while it is started every ``asyncio.run`` (and every
    pytest-asyncio test) later in the session would refuse to start.
    """
    # Playwright must never fetch a browser of its own: we hand it Debian's.
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(chromium_executable), args=list(LAUNCH_ARGS)
        )
        try:
            yield launched
        finally:
            launched.close()
    if _thread_has_running_loop():
        pytest.fail("Playwright left an event loop marked running in the test thread")


def _thread_has_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def context(
    browser: Browser, ui_engine: UiEngine, request: pytest.FixtureRequest
) -> Iterator[BrowserContext]:
    """A browser context of its own (its own cookies) on the module's engine (``ui_engine``,
    which each module defines), at the module's ``VIEWPORT`` (default 1280 x 800)."""
    viewport = getattr(request.module, "VIEWPORT", {"width": 1280, "height": 800})
    ctx = browser.new_context(base_url=ui_engine.url, viewport=viewport)
    ctx.set_default_timeout(PAGE_S * 1000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(autouse=True)
def _screenshots_in_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hand the test's screenshots to its report (listed by the root conftest)."""
    yield
    for path in drain():
        request.node.user_properties.append((SCREENSHOT_PROPERTY, str(path)))
