"""What the end of a test run lists besides pass and fail: the browser tests' screenshots.

Tests put ``(SCREENSHOT_PROPERTY, path)`` in their report's ``user_properties``; reports
reach the main process also under pytest-xdist, where the terminal summary is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pytest

SCREENSHOT_PROPERTY: Final = "screenshot"

_SCREENSHOTS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _SCREENSHOTS.extend(
            str(value) for key, value in report.user_properties if key == SCREENSHOT_PROPERTY
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SCREENSHOTS:
        terminalreporter.write_sep("-", "browser screenshots")
        for path in _SCREENSHOTS:
            terminalreporter.write_line(path)
