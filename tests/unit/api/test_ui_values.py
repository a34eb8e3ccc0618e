"""How the UI writes values and times: JSON escaped once (the template escapes; these never
do), long values cut with a count, class paths as class names with their origin, and times
as a person reads them, inside sentences too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import escape

from engine.api.ui.rendering import templates
from engine.api.ui.times import readable_time, span_words, with_readable_times
from engine.api.ui.values import (
    INDENT_UP_TO_CHARS,
    ONE_LINE_JSON_CHARS,
    class_name,
    class_origin,
    json_text,
    shown,
    shown_json,
)

NOW = datetime(2026, 11, 29, 5, 19, 30, tzinfo=UTC)


def test_short_json_stays_on_one_line_and_long_json_is_indented() -> None:
    assert json_text({"rows": 3}) == '{"rows": 3}'
    long = {"key": "v" * ONE_LINE_JSON_CHARS}
    assert json_text(long) == '{\n  "key": "' + "v" * ONE_LINE_JSON_CHARS + '"\n}'
    huge = {"key": "v" * INDENT_UP_TO_CHARS}  # not worth indenting in the event loop
    assert json_text(huge) == '{"key": "' + "v" * INDENT_UP_TO_CHARS + '"}'


def test_json_text_writes_markup_and_non_ascii_as_themselves() -> None:
    text = json_text({"note": "<script>é</script> & 'q'"})
    assert text == """{"note": "<script>é</script> & 'q'"}"""
    assert "\\u003c" not in text and "\\u00e9" not in text


def test_a_json_box_escapes_the_value_exactly_once() -> None:
    macros = templates.env.get_template("ui/macros.html").make_module({"csrf_token": ""})
    html = str(macros.json_box({"note": "<b>&</b>"}))
    assert "&lt;b&gt;&amp;&lt;/b&gt;" in html  # once: the markup shows as text
    assert "&amp;lt;" not in html and "\\u003c" not in html  # never twice
    assert "more characters" not in html


def test_a_long_value_is_cut_with_the_count_left_out() -> None:
    assert shown("abc", 3) == shown("abc")
    assert shown("abc", 3).left_out == 0
    cut = shown("abcdef", 4)
    assert (cut.text, cut.left_out) == ("abcd", 2)
    big = shown_json({"blob": "x" * 30_000})
    assert (
        len(big.text) == 20_000 and big.left_out == len(json_text({"blob": "x" * 30_000})) - 20_000
    )


@pytest.mark.parametrize(
    ("classpath", "name", "origin"),
    [
        (
            "sluice_dag_b11fd6e3a1c2d4e5_example_multiple_deferrals.ProcessItemsOneByOne",
            "ProcessItemsOneByOne",
            "ProcessItemsOneByOne, defined in the DAG file example_multiple_deferrals "
            "(module sluice_dag_b11fd6e3a1c2d4e5_example_multiple_deferrals)",
        ),
        (
            "engine.authoring.operators.python.PythonOperator",
            "PythonOperator",
            "engine.authoring.operators.python.PythonOperator",
        ),
        ("Bare", "Bare", "Bare"),
    ],
)
def test_a_class_path_shows_its_class_name_and_its_origin(
    classpath: str, name: str, origin: str
) -> None:
    assert class_name(classpath) == name
    assert class_origin(classpath) == origin


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0.4, "0 s"), (40, "40 s"), (89, "89 s"), (180, "3 min"), (5399, "90 min"),
     (5 * 3600, "5 h"), (86400 * 2, "2 days"), (86400 * 1.6, "2 days"), (-180, "3 min")],
)  # fmt: skip
def test_spans_are_rounded_as_people_say_them(seconds: float, words: str) -> None:
    assert span_words(seconds) == words


def test_a_time_reads_as_date_minute_utc_and_how_long_ago() -> None:
    three_min_ago = (NOW - timedelta(minutes=3, seconds=12)).isoformat()
    assert readable_time(three_min_ago, NOW) == "2026-11-29 05:16 UTC, 3 min ago"
    assert readable_time(NOW + timedelta(hours=5), NOW) == "2026-11-29 10:19 UTC, in 5 h"
    assert readable_time(NOW, NOW.isoformat()) == "2026-11-29 05:19 UTC, just now"
    paris = "2026-11-29T06:16:18.123456+01:00"  # another offset: written in UTC
    assert readable_time(paris, NOW) == "2026-11-29 05:16 UTC, 3 min ago"
    assert readable_time("not a time", NOW) == "not a time"


def test_iso_times_in_a_sentence_become_time_elements_and_the_rest_is_escaped() -> None:
    at = "2026-11-29T05:16:18.123456+00:00"
    message = f"waiting for <b> (queued at {at}); partition 2026-03-10T09:00:00 & more"
    html = str(with_readable_times(message, NOW))
    assert html == (
        f'waiting for &lt;b&gt; (queued at <time datetime="{at}" title="{at}">'
        "2026-11-29 05:16 UTC, 3 min ago</time>); partition 2026-03-10T09:00:00 &amp; more"
    )  # a time without an offset (a partition key) is left as text
    assert str(with_readable_times("no time here", NOW)) == str(escape("no time here"))
