"""The shared-stream sparkline and the state looks (pure helpers of the web UI)."""

from __future__ import annotations

import pytest

from engine.api.ui.sparkline import PAD_PX, sparkline
from engine.api.ui.states import legend, look


def ys(points: str) -> list[float]:
    return [float(p.split(",")[1]) for p in points.split()]


def xs(points: str) -> list[float]:
    return [float(p.split(",")[0]) for p in points.split()]


def test_an_empty_series_has_no_chart() -> None:
    assert sparkline([]) is None


def test_a_rising_series_rises_and_spans_the_box() -> None:
    chart = sparkline([0, 5, 10], width=100, height=20)
    assert chart is not None
    heights = ys(chart.points)
    assert heights == sorted(heights, reverse=True)  # SVG y grows downwards
    assert heights[0] == pytest.approx(20 - PAD_PX) and heights[-1] == pytest.approx(PAD_PX)
    assert xs(chart.points)[0] == pytest.approx(PAD_PX)
    assert xs(chart.points)[-1] == pytest.approx(100 - PAD_PX)
    assert (chart.low, chart.high, chart.last) == (0, 10, 10)


def test_positive_values_are_drawn_from_zero() -> None:
    chart = sparkline([500, 505], height=20)
    assert chart is not None and chart.low == 0
    assert all(y < 3 for y in ys(chart.points))  # both near the top, not a steep slope


def test_a_flat_zero_series_lies_on_the_floor() -> None:
    chart = sparkline([0, 0, 0], height=20)
    assert chart is not None and set(ys(chart.points)) == {20 - PAD_PX}


def test_one_sample_is_a_short_stroke_at_the_right() -> None:
    chart = sparkline([3], width=100)
    assert chart is not None and len(chart.points.split()) == 2
    assert xs(chart.points)[-1] == pytest.approx(100 - PAD_PX)


@pytest.mark.parametrize("state", ["success", "failed", "running", "queued", "up_for_retry"])
def test_each_known_state_has_its_class_a_symbol_and_a_word(state: str) -> None:
    found = look(state)
    assert found.css == f"state-{state}"
    assert found.symbol and found.label


def test_no_state_reads_as_no_status_and_an_unknown_one_by_its_name() -> None:
    assert look(None).label == "no status"
    assert look("some_new_state").css == "state-unknown"
    assert look("some_new_state").label == "some new state"


def test_the_legend_symbols_are_distinct() -> None:
    symbols = [entry.symbol for entry in legend()]
    assert len(set(symbols)) == len(symbols)
