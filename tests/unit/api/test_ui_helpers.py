"""The web UI's small pure helpers: the runs grid's rows, triggers grouped by triggerer,
the engine page's jobs (Celery workers apart, live ones first), the asset graph's items and
links, when an asset page follows new runs, form JSON fields, times and durations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from engine.api.ui.asset_pages import awaits_runs, graph_items
from engine.api.ui.fleet_pages import by_triggerer, shown_jobs
from engine.api.ui.grid import GridRow, grid_rows
from engine.api.ui.rendering import (
    asset_url,
    json_object_field,
    seconds,
    short_time,
    task_url,
)


def test_grid_rows_follow_the_dag_order_and_list_each_copy_of_a_mapped_task() -> None:
    runs = [
        {"tasks": {"extract": "success", "load[1]": "success", "load[0]": "failed"}},
        {"tasks": {"extract": "running", "load[2]": "none", "gone": "success"}},
    ]
    assert grid_rows(["extract", "load", "report"], runs) == [
        GridRow("extract", "extract"),
        GridRow("load[0]", "load", 0),
        GridRow("load[1]", "load", 1),
        GridRow("load[2]", "load", 2),
        GridRow("report", "report"),  # no run has it yet: an empty row
        GridRow("gone", "gone"),  # a task the DAG lost, still in an old run
    ]


def test_a_task_id_with_brackets_is_not_taken_for_a_copy() -> None:
    assert grid_rows(["odd[1]"], [{"tasks": {"odd[1]": "success"}}]) == [
        GridRow("odd[1]", "odd[1]")
    ]


def job(job_id: int, *, alive: bool) -> dict[str, object]:
    return {"id": job_id, "alive": alive}


def test_triggers_are_grouped_by_triggerer_live_ones_first_then_unclaimed() -> None:
    triggers = [
        {"id": 1, "triggerer_id": 7},
        {"id": 2, "triggerer_id": None},
        {"id": 3, "triggerer_id": 5},
        {"id": 4, "triggerer_id": 9},  # its owner ended: not among the running jobs
    ]
    groups = by_triggerer(triggers, [job(5, alive=False), job(7, alive=True), job(8, alive=True)])
    assert [(g["owner_id"], [t["id"] for t in g["triggers"]]) for g in groups] == [
        (7, [1]),
        (8, []),
        (5, [3]),
        (9, [4]),
        (None, [2]),
    ]
    assert groups[3]["job"] is None


def _job(
    job_id: int, job_type: str, status: str, queues: list[str] | None = None
) -> dict[str, Any]:
    return {
        "id": job_id,
        "type": job_type,
        "alive": status == "alive",
        "ended": "2026-11-27T10:00:00+00:00" if status == "ended" else None,
        "queues": queues,
    }


def test_the_engine_page_puts_celery_workers_apart_and_live_jobs_first() -> None:
    jobs = [
        _job(1, "dag_processor", "ended"),
        _job(2, "executor", "dead", ["gpu"]),
        _job(3, "scheduler", "dead"),
        _job(4, "executor", "alive", ["default", "gpu"]),
        _job(5, "triggerer", "alive"),
        _job(6, "executor", "alive"),  # the Celery sender, or a local executor
        _job(7, "api", "alive"),
        _job(8, "something_new", "alive"),
    ]
    workers, parts = shown_jobs(jobs)
    assert [(j["id"], j["status"]) for j in workers] == [(4, "alive"), (2, "dead")]
    assert [(j["id"], j["part"], j["status"]) for j in parts] == [
        (7, "API server", "alive"),
        (6, "executor", "alive"),
        (8, "something_new", "alive"),
        (5, "triggerer", "alive"),
        (3, "scheduler", "dead"),
        (1, "DAG processor", "ended"),
    ]
    _, parts = shown_jobs(jobs, celery=True)  # the executor that is no worker sends tries
    assert [j["part"] for j in parts if j["type"] == "executor"] == [
        "executor (sends tries to Celery)"
    ]


def test_graph_items_link_each_node_to_its_page_and_flag_a_failing_watcher() -> None:
    graph = {
        "nodes": [
            {"id": "asset:a/b", "kind": "asset", "label": "a/b", "events": 2},
            {"id": "dag:d", "kind": "dag", "label": "d", "paused": True},
            {"id": "task:p/t", "kind": "task", "label": "t", "dag_id": "p"},
            {
                "id": "watcher:a/b/w",
                "kind": "watcher",
                "label": "w",
                "classpath": "triggers.X",
                "last_error": "boom",
            },
        ],
        "edges": [{"source": "watcher:a/b/w", "target": "asset:a/b", "kind": "updates"}],
    }
    items, edges = graph_items(graph)
    by_id = {item.id: item for item in items}
    assert by_id["asset:a/b"].href == "/assets/a/b"
    assert by_id["dag:d"].href == "/dags/d" and "paused" in by_id["dag:d"].title
    assert by_id["task:p/t"].href == "/dags/p"
    watcher = by_id["watcher:a/b/w"]
    assert watcher.href is None and watcher.flagged and "boom" in watcher.title
    assert edges == [("watcher:a/b/w", "asset:a/b")]


@pytest.mark.parametrize(
    ("consumers", "runs", "emitted", "expected"),
    [
        (["d"], [], 3, True),
        (["d"], ["d/r1"], 3, False),
        ([], [], 3, False),  # nothing consumes it: no run will come
        (["d"], [], None, False),
        (["d"], [], 4, False),  # the emitted event is not on this page
    ],
)
def test_an_asset_page_follows_the_runs_of_an_event_just_emitted(
    consumers: list[str], runs: list[str], emitted: int | None, expected: bool
) -> None:
    asset = {"consuming_dags": consumers}
    assert awaits_runs(asset, [{"id": 3, "runs": runs}], emitted) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", None), ("  ", None), ('{"a": 1}', {"a": 1})],
)
def test_a_json_object_field(text: str, expected: object) -> None:
    assert json_object_field(text, "conf") == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [("[1]", "conf must be a JSON object"), ("{", "conf is not valid JSON"), ("3", "not int")],
)
def test_a_json_object_field_refuses_anything_else_naming_the_field(
    text: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        json_object_field(text, "conf")


def test_times_and_durations_read_briefly() -> None:
    when = datetime(2026, 11, 25, 19, 3, 12, 123456, tzinfo=UTC)
    assert short_time(when) == short_time(when.isoformat()) == "2026-11-25 19:03:12"
    assert short_time(None) == "\u2013" and short_time("not a time") == "not a time"
    assert [seconds(v) for v in (0.42, 12.3, 300, 9000, None)] == [
        "0.4 s",
        "12 s",
        "5 min",
        "2.5 h",
        "\u2013",
    ]


def test_urls_keep_ids_in_one_path_segment() -> None:
    url = task_url("d", "manual__2026-01-01T00:00:00+00:00", "t", 2)
    assert url == "/dags/d/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00/tasks/t?map_index=2"
    assert asset_url("s3://bucket/x y") == "/assets/s3%3A//bucket/x%20y"
