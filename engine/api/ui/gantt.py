"""A run's Gantt chart: one row per task instance (its latest try), a thin bar from when it
was queued to when it started and a full bar from its start to its end (to ``now`` while
it runs), on one time axis from the run's first moment to its last.

Pure: times and ``now`` come from the caller; ``templates/ui/gantt.svg.html`` writes the
SVG from the rows and ticks computed here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

ROW_HEIGHT: Final = 22.0
BAR_HEIGHT: Final = 14.0
WAIT_HEIGHT: Final = 4.0
AXIS_HEIGHT: Final = 22.0
CHART_WIDTH: Final = 720.0
#: The smallest bar drawn, so a task of a few milliseconds is still visible.
MIN_BAR_PX: Final = 2.0
#: Tick spacings tried for the axis, in seconds: the first giving at most ``MAX_TICKS``.
TICK_STEPS_S: Final = (
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    21600,
)
MAX_TICKS: Final = 8


@dataclass(frozen=True, slots=True)
class GanttRow:
    """One task instance's row: ``wait`` is its queued span and ``bar`` its run span, each
    ``(x, width)`` in px, None when that span has not begun."""

    name: str
    href: str
    state: str
    y: float
    wait: tuple[float, float] | None
    bar: tuple[float, float] | None
    title: str


@dataclass(frozen=True, slots=True)
class GanttChart:
    rows: tuple[GanttRow, ...]
    ticks: tuple[tuple[float, str], ...]  # (x, label) along the axis
    width: float
    height: float
    span_s: float


def _parse(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _tick_label(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3600:g} h"


def ticks(span_s: float, scale: float) -> tuple[tuple[float, str], ...]:
    """Axis ticks at a round spacing (``TICK_STEPS_S``) over ``span_s`` seconds."""
    step = next((s for s in TICK_STEPS_S if span_s / s <= MAX_TICKS), None)
    if step is None:
        step = math.ceil(span_s / MAX_TICKS / 3600) * 3600
    count = int(span_s / step + 1e-9)
    return tuple(
        (round(i * step * scale, 1), _tick_label(round(i * step, 6))) for i in range(count + 1)
    )


def chart(
    instances: Sequence[Mapping[str, Any]], *, now: datetime, href: Mapping[str, str]
) -> GanttChart:
    """The chart of ``instances`` (``engine.views.tasks.TaskInstanceItem``s: their
    ``queued_at`` / ``start_date`` / ``end_date`` as ISO text), each row linked by
    ``href[name]`` (``name``: ``task_id`` or ``task_id[map_index]``)."""
    spans = [_Span.of(ti) for ti in instances]
    moments = [m for span in spans for m in (span.queued, span.start, span.end) if m]
    if any(span.start and not span.end for span in spans):
        moments.append(now)  # a try still running: the axis runs to now
    origin = min(moments, default=now)
    span_s = max((max(moments, default=now) - origin).total_seconds(), 1.0)
    scale = CHART_WIDTH / span_s
    rows = tuple(
        _row(span, AXIS_HEIGHT + index * ROW_HEIGHT, href, origin, scale, now)
        for index, span in enumerate(spans)
    )
    height = AXIS_HEIGHT + len(rows) * ROW_HEIGHT + 4
    return GanttChart(rows, ticks(span_s, scale), CHART_WIDTH, height, round(span_s, 3))


@dataclass(frozen=True, slots=True)
class _Span:
    name: str
    state: str
    queued: datetime | None
    start: datetime | None
    end: datetime | None

    @classmethod
    def of(cls, ti: Mapping[str, Any]) -> _Span:
        index = ti.get("map_index", -1)
        name = str(ti["task_id"]) if index == -1 else f"{ti['task_id']}[{index}]"
        times = (_parse(ti.get(key)) for key in ("queued_at", "start_date", "end_date"))
        return cls(name, str(ti["state"]), *times)


def _row(
    span: _Span,
    y: float,
    href: Mapping[str, str],
    origin: datetime,
    scale: float,
    now: datetime,
) -> GanttRow:
    wait = _span(span.queued, span.start or now, origin, scale) if span.queued else None
    bar = _span(span.start, span.end or now, origin, scale) if span.start else None
    title = _title(span, now)
    return GanttRow(span.name, href.get(span.name, ""), span.state, y, wait, bar, title)


def _span(
    begin: datetime | None, end: datetime | None, origin: datetime, scale: float
) -> tuple[float, float] | None:
    if begin is None or end is None:
        return None
    x = (begin - origin).total_seconds() * scale
    width = max((end - begin).total_seconds() * scale, MIN_BAR_PX)
    return round(x, 1), round(width, 1)


def _title(span: _Span, now: datetime) -> str:
    parts = [f"{span.name}: {span.state.replace('_', ' ')}"]
    if span.queued and span.start:
        parts.append(f"waited {(span.start - span.queued).total_seconds():.1f} s")
    if span.start:
        verb = "ran" if span.end else "running for"
        parts.append(f"{verb} {((span.end or now) - span.start).total_seconds():.1f} s")
    return ", ".join(parts)
