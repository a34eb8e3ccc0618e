"""What the browser tests do on a page, shared by their modules: log in, take a screenshot
(listed at the end of the run), read the page's CSRF token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import quote, urlparse

from tests.browser.engine import PASSWORD
from tests.browser.screenshots import record_screenshot

if TYPE_CHECKING:
    from pathlib import Path

    from playwright.sync_api import BrowserContext, Page

#: How long a page may take to answer or show what is waited for (a loaded 2-core machine).
PAGE_S: Final = 30.0


def log_in(context: BrowserContext, username: str, next_path: str = "/") -> Page:
    """A new page of ``context`` logged in as ``username`` (the engine's test password),
    on ``next_path`` once the login form has sent it there."""
    page = context.new_page()
    page.goto(f"/login?next={quote(next_path, safe='/')}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: urlparse(url).path != "/login")
    return page


def shoot(page: Page, folder: Path, name: str, *, docs_name: str | None = None) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    record_screenshot(path, docs_name=docs_name)


def csrf_of(page: Page) -> str:
    value = page.locator('input[name="csrf_token"]').first.get_attribute("value")
    assert value, "no CSRF token on the page"
    return value
