"""The read model's pure parts: pages, JSON-able values, advance rates, log chunks, and a
log path that leaves the log folder."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from engine.task_log_files import (
    LogPathOutsideFolderError,
    TaskLogNotFoundError,
    log_path,
    read_task_log,
    resolve_inside,
)
from engine.views.common import MAX_LIMIT, PageError, check_page, jsonable, page
from engine.views.streams import advance_rate
from engine.views.tasks import task_log

if TYPE_CHECKING:
    from pathlib import Path

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("limit", "offset"), [(0, 0), (MAX_LIMIT + 1, 0), (10, -1)])
def test_a_page_out_of_bounds_is_refused(limit: int, offset: int) -> None:
    with pytest.raises(PageError):
        check_page(limit, offset)


def test_page() -> None:
    check_page(None, 0)
    assert page((1, 2), 7, 2, 4) == {"items": [1, 2], "total": 7, "limit": 2, "offset": 4}


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ({1: (1, 2)}, {"1": [1, 2]}),
        ({"b", "a"}, ["a", "b"]),
        (T0, "2026-01-01T00:00:00+00:00"),
        (date(2026, 1, 2), "2026-01-02"),
        (b"caf\xc3\xa9\xff", "café\\xff"),
        (math.nan, "nan"),
        (-math.inf, "-inf"),
        (timedelta(seconds=3), "0:00:03"),
        ([None, True, 1.5, "x"], [None, True, 1.5, "x"]),
    ],
)
def test_jsonable(value: Any, shown: Any) -> None:
    assert jsonable(value) == shown


def _sample(at_s: float, advanced: int, triggerer: int = 1) -> Any:
    return SimpleNamespace(
        sampled_at=T0 + timedelta(seconds=at_s), advanced_events=advanced, triggerer_id=triggerer
    )


@pytest.mark.parametrize(
    ("samples", "rate"),
    [
        ([], None),
        ([_sample(0, 5)], None),
        ([_sample(0, 0), _sample(10, 30)], 3.0),
        ([_sample(0, 0), _sample(5, 10), _sample(10, 30)], 3.0),
        # the group moved to triggerer 2: its counters started again there
        ([_sample(0, 500, 1), _sample(5, 10, 2), _sample(10, 30, 2)], 4.0),
        # counters restarted on the same triggerer (the group was restarted)
        ([_sample(0, 500), _sample(5, 10), _sample(10, 20)], 2.0),
        ([_sample(0, 5), _sample(0, 5)], None),
    ],
)
def test_advance_rate(samples: list[Any], rate: float | None) -> None:
    assert advance_rate(samples) == rate


def test_a_log_read_in_chunks_never_splits_a_character(tmp_path: Path) -> None:
    path = log_path(tmp_path, "d", "r", "t", 1)
    path.parent.mkdir(parents=True)
    text = "aé✓𝄞b" * 3
    path.write_bytes(text.encode())
    read, offset = "", 0
    while True:
        chunk = task_log(tmp_path, "d", "r", "t", 1, offset=offset, max_bytes=3)
        if chunk["next_offset"] == offset:
            break
        read += chunk["content"]
        offset = chunk["next_offset"]
    assert read == text and offset == len(text.encode())


def test_a_log_path_that_leaves_the_folder_is_refused(tmp_path: Path) -> None:
    folder, outside = tmp_path / "logs", tmp_path / "secret.txt"
    outside.write_text("secret")
    link = log_path(folder, "d", "r", "t", 1)
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    with pytest.raises(LogPathOutsideFolderError):
        read_task_log(folder, "d", "r", "t", 1)
    with pytest.raises(TaskLogNotFoundError):
        task_log(folder, "d", "r", "t")
    with pytest.raises(LogPathOutsideFolderError):
        resolve_inside(folder, folder / ".." / "secret.txt")
    assert resolve_inside(folder, folder / "d" / ".." / "d") == (folder / "d").resolve()
