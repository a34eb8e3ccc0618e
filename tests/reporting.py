"""What the end of a test run lists besides pass and fail: the browser tests' screenshots, the
producer conformance kit's figures per broker and case, and the API fuzzer's summaries.

Tests put ``(SCREENSHOT_PROPERTY, path)``, ``(CONFORMANCE_PROPERTY, figures)`` or
``(FUZZ_PROPERTY, summary)`` in their report's ``user_properties``; reports reach the main
process also under pytest-xdist, where the terminal summary is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pytest

SCREENSHOT_PROPERTY: Final = "screenshot"
#: a dict: broker, case, messages, events, lost, duplicated, takeover_s (None: not measured)
CONFORMANCE_PROPERTY: Final = "conformance"
#: text: the closing summary of the schemathesis run (tests/integration/test_api_fuzz.py)
FUZZ_PROPERTY: Final = "api_fuzz"

_SCREENSHOTS: list[str] = []
_CONFORMANCE: list[dict[str, Any]] = []
_FUZZ: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _SCREENSHOTS.extend(
            str(value) for key, value in report.user_properties if key == SCREENSHOT_PROPERTY
        )
    if report.when == "call":
        _FUZZ.extend(str(value) for key, value in report.user_properties if key == FUZZ_PROPERTY)
        outcome = "xfail" if hasattr(report, "wasxfail") else report.outcome
        _CONFORMANCE.extend(
            {**value, "outcome": outcome}
            for key, value in report.user_properties
            if key == CONFORMANCE_PROPERTY
        )


def conformance_table(rows: list[dict[str, Any]]) -> list[str]:
    """The kit's figures as text lines, one per broker and case, sorted."""
    head = f"{'broker':<9} {'case':<22} {'outcome':<8} {'messages':>8} {'events':>7} "
    head += f"{'lost':>5} {'dup':>4} {'takeover s':>10}"
    lines = [head]
    for row in sorted(rows, key=lambda r: (r["broker"], r["case"])):
        takeover = row.get("takeover_s")
        lines.append(
            f"{row['broker']:<9} {row['case']:<22} {row['outcome']:<8} {row['messages']:>8} "
            f"{row['events']:>7} {row['lost']:>5} {row['duplicated']:>4} "
            f"{'-' if takeover is None else f'{takeover:.2f}':>10}"
        )
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SCREENSHOTS:
        terminalreporter.write_sep("-", "browser screenshots")
        for path in _SCREENSHOTS:
            terminalreporter.write_line(path)
    if _CONFORMANCE:
        terminalreporter.write_sep("-", "producer conformance kit")
        for line in conformance_table(_CONFORMANCE):
            terminalreporter.write_line(line)
    for summary in _FUZZ:
        terminalreporter.write_sep("-", "API fuzzer (schemathesis)")
        terminalreporter.write_line(summary)
