"""Task log paths, reading the latest try, and writing that survives a full disk."""

from __future__ import annotations

import io
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.executor.task_logs import (
    MAX_COMPONENT_CHARS,
    TaskLogNotFoundError,
    TaskLogWriter,
    log_path,
    logged_tries,
    read_task_log,
    safe_component,
)


def test_log_path_layout() -> None:
    path = log_path(Path("/logs"), "etl", "manual__2030-01-01T00:00:00", "load", 3)
    assert path == Path("/logs/etl/manual__2030-01-01T00%3A00%3A00/load/attempt=3.log")


@pytest.mark.parametrize(
    ("text", "safe"),
    [("a/b", "a%2Fb"), ("..", "%2E%2E"), (".", "%2E"), ("", "%"), ("x y", "x%20y")],
)
def test_safe_component_escapes_what_could_escape_the_folder(text: str, safe: str) -> None:
    assert safe_component(text) == safe


def test_long_ids_are_bounded_and_stay_distinct() -> None:
    one, two = safe_component("x" * 500 + "1"), safe_component("x" * 500 + "2")
    assert len(one) == len(two) == MAX_COMPONENT_CHARS and one != two


@given(st.text(max_size=300), st.text(max_size=300))
def test_safe_component_is_one_bounded_component_and_injective(a: str, b: str) -> None:
    safe = safe_component(a)
    assert "/" not in safe and "\x00" not in safe and safe not in ("", ".", "..")
    assert len(safe) <= MAX_COMPONENT_CHARS
    assert (safe == safe_component(b)) == (a == b)


def test_read_task_log_reads_the_latest_try_by_default(tmp_path: Path) -> None:
    for n in (1, 2, 10):
        path = log_path(tmp_path, "d", "r", "t", n)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"try {n}\n")
    (path.parent / "attempt=x.log").write_text("ignored")
    assert logged_tries(tmp_path, "d", "r", "t") == [1, 2, 10]
    assert read_task_log(tmp_path, "d", "r", "t") == "try 10\n"
    assert read_task_log(tmp_path, "d", "r", "t", 2) == "try 2\n"
    with pytest.raises(TaskLogNotFoundError, match=r"try 3 .*tries with a log: 1, 2, 10"):
        read_task_log(tmp_path, "d", "r", "t", 3)
    with pytest.raises(TaskLogNotFoundError, match="has not run yet"):
        read_task_log(tmp_path, "d", "r", "other")


async def test_writer_appends_across_steps(tmp_path: Path) -> None:
    path = log_path(tmp_path, "d", "r", "t", 1)
    with anyio.fail_after(5):
        for step in (b"first\n", b"second\n"):
            writer = TaskLogWriter(path)
            await writer.write(step)
            await writer.aclose()
    assert path.read_bytes() == b"first\nsecond\n"
    assert writer.failed is None and writer.bytes_written == len(b"second\n")


async def test_a_full_disk_sends_the_log_to_the_fallback(caplog) -> None:
    fallback = io.BytesIO()
    writer = TaskLogWriter(Path("/dev/full"), fallback=fallback)  # every write: ENOSPC
    with anyio.fail_after(5):
        await writer.write(b"line one\n")
        await writer.write(b"line two\n")
        await writer.aclose()
    assert isinstance(writer.failed, OSError)
    text = fallback.getvalue().decode()
    assert "unwritable" in text and text.endswith("line one\nline two\n")
    assert [r.action for r in caplog.records] == ["task_log_unwritable"]


async def test_an_unusable_log_folder_sends_the_log_to_the_fallback(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    fallback = io.BytesIO()
    writer = TaskLogWriter(tmp_path / "file" / "attempt=1.log", fallback=fallback)
    with anyio.fail_after(5):
        await writer.write(b"hello\n")
        await writer.aclose()
    assert writer.failed is not None and fallback.getvalue().endswith(b"hello\n")


async def test_secrets_added_while_a_task_runs_are_masked_from_then_on(tmp_path: Path) -> None:
    writer = TaskLogWriter(tmp_path / "attempt=1.log")
    await writer.write(b"before: pw-read-later\n")
    writer.add_secrets(["pw-read-later", ""])
    await writer.write(b"after: pw-read-")
    await writer.write(b"later and again pw-read-later\n")
    writer.close()
    text = (tmp_path / "attempt=1.log").read_text()
    assert text == "before: pw-read-later\nafter: *** and again ***\n"


def test_redact_masks_the_configured_secrets_and_those_added(tmp_path: Path) -> None:
    """What leaves the log about a try (its error) is masked as the log is."""
    writer = TaskLogWriter(tmp_path / "attempt=1.log", secrets=["configured-pw"])
    assert writer.redact("a configured-pw and a pw-read-later") == ("a *** and a pw-read-later")
    writer.add_secrets(["p@ss-read-later"])
    assert writer.redact("u:p%40ss-read-later@h and p@ss-read-later") == "u:***@h and ***"
    writer.close()
