"""A small line chart of a series as SVG polyline points (for the shared-stream history).

Pure: values in, coordinates out; the template draws them. The vertical scale starts at 0
when every value is positive (a backlog of 5 next to one of 500 should look small), and the
newest value is at the right edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

WIDTH_PX: Final = 120.0
HEIGHT_PX: Final = 24.0
PAD_PX: Final = 2.0  # keeps the stroke inside the box at the extremes


@dataclass(frozen=True, slots=True)
class Sparkline:
    """``points`` for ``<polyline points=...>`` in a ``width`` x ``height`` box; the range
    drawn (``low`` .. ``high``) and the newest value, for the text beside it."""

    points: str
    width: float
    height: float
    low: float
    high: float
    last: float


def sparkline(
    values: Sequence[float], *, width: float = WIDTH_PX, height: float = HEIGHT_PX
) -> Sparkline | None:
    """The chart of ``values`` (oldest first); None for an empty series."""
    if not values:
        return None
    low = min(0.0, min(values))
    high = max(values)
    span = high - low
    inner_h = height - 2 * PAD_PX
    step = (width - 2 * PAD_PX) / (len(values) - 1) if len(values) > 1 else 0.0

    def y(value: float) -> float:
        if span == 0:
            return height - PAD_PX  # a flat series (all zero) lies on the floor
        return PAD_PX + inner_h * (high - value) / span

    coords = [(PAD_PX + i * step, y(v)) for i, v in enumerate(values)]
    if len(coords) == 1:  # one sample: a short flat stroke at the right edge
        coords = [(width - PAD_PX - 4, coords[0][1]), (width - PAD_PX, coords[0][1])]
    points = " ".join(f"{x:.1f},{py:.1f}" for x, py in coords)
    return Sparkline(points, width, height, float(low), float(high), float(values[-1]))
