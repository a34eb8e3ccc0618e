"""Every GET endpoint of the REST resources against a database holding something of
everything (``api_world``), on SQLite and PostgreSQL: what each answers, filters and pages,
404s for unknown ids, task logs only from inside the log folder, and no secret in any
answer."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest

from tests.integration.api_world import (
    CONN_SECRET,
    STREAM_KEY,
    TRIGGER_SECRET,
    World,
    build_world,
    world_database,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world_url(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[str]:
    yield from world_database(request, tmp_path_factory, "reads")


@pytest.fixture(scope="module")
def world(world_url: str, tmp_path_factory: Any) -> Iterator[World]:
    built = build_world(world_url, tmp_path_factory.mktemp("reads-world"))
    yield built
    built.api.db.dispose()


def _run(dag_id: str, run_id: str) -> str:
    return f"/api/v1/dags/{dag_id}/runs/{quote(run_id, safe='')}"


def _get(world: World, path: str, role: str = "viewer") -> Any:
    answer = world.client(role).get(path)
    assert answer.status_code == 200, (path, answer.status_code, answer.text)
    return answer.json()


def _problem(world: World, path: str, status: int) -> str:
    answer = world.client("viewer").get(path)
    assert answer.status_code == status, (path, answer.text)
    assert answer.headers["content-type"].startswith(PROBLEM)
    detail: str = answer.json()["detail"]
    return detail


def _all_get_paths(world: World) -> list[str]:
    etl, fanout = _run("etl", world.etl_run), _run("fanout", world.fanout_run)
    return [
        "/api/v1/dags",
        "/api/v1/dags/etl",
        "/api/v1/dags/consumer",
        "/api/v1/runs",
        "/api/v1/dags/etl/runs",
        etl,
        _run("consumer", world.consumer_run),
        f"{etl}/tasks",
        f"{etl}/tasks/extract",
        f"{etl}/tasks/extract/logs",
        f"{etl}/tasks/extract/results",
        f"{fanout}/tasks",
        f"{fanout}/tasks/one?map_index=1",
        "/api/v1/assets",
        "/api/v1/assets/inbox",
        "/api/v1/asset-events",
        "/api/v1/asset-graph",
        "/api/v1/triggers",
        "/api/v1/jobs?include_ended=true",
        "/api/v1/queues",
        "/api/v1/streams",
        "/api/v1/openapi.json",
    ]


def test_every_get_answers_and_no_secret_is_in_any_answer(world: World) -> None:
    world.heartbeat()
    bodies = [world.client("viewer").get(path) for path in _all_get_paths(world)]
    assert [b.status_code for b in bodies] == [200] * len(bodies), [
        (b.url, b.text[:200]) for b in bodies if b.status_code != 200
    ]
    for answer in bodies:
        for secret in (TRIGGER_SECRET, CONN_SECRET):
            assert secret not in answer.text, f"{secret} in {answer.url}"
    watcher = _get(world, "/api/v1/assets/inbox")["watchers"][0]
    assert watcher["classpath"] == "triggers.file.FileDeleteTrigger"
    assert "kwargs" not in watcher


def test_a_read_without_credentials_is_401(world: World) -> None:
    for path in _all_get_paths(world)[:-1]:  # the OpenAPI document is public
        answer = world.api.client().get(path)
        assert answer.status_code == 401, path
        assert answer.headers["content-type"].startswith(PROBLEM)


def test_dags_list_filters_and_pages(world: World) -> None:
    listed = _get(world, "/api/v1/dags")
    assert listed["total"] == 4 and listed["limit"] == 50 and listed["offset"] == 0
    by_id = {d["dag_id"]: d for d in listed["items"]}
    assert sorted(by_id) == ["consumer", "etl", "fanout", "hourly"]
    assert by_id["etl"]["last_run_states"] == ["queued", "queued"]
    assert by_id["etl"]["run_counts"] == {"queued": 2}
    assert by_id["etl"]["tags"] == ["team-a"]
    assert by_id["consumer"]["schedule"] == "assets report | inbox"
    assert by_id["consumer"]["next_run"] == "none"
    assert by_id["hourly"]["timetable"] is not None
    assert by_id["hourly"]["paused"] is False
    page = _get(world, "/api/v1/dags?limit=2&offset=2")
    assert [d["dag_id"] for d in page["items"]] == ["fanout", "hourly"]
    assert (page["total"], page["limit"], page["offset"]) == (4, 2, 2)
    assert [d["dag_id"] for d in _get(world, "/api/v1/dags?tag=team-b")["items"]] == ["consumer"]
    assert [d["dag_id"] for d in _get(world, "/api/v1/dags?search=an")["items"]] == ["fanout"]
    assert _get(world, "/api/v1/dags?paused=true")["total"] == 0
    for bad in ("limit=0", "limit=501", "offset=-1", "paused=maybe"):
        assert "query" in _problem(world, f"/api/v1/dags?{bad}", 422)


def test_dag_show(world: World) -> None:
    etl = _get(world, "/api/v1/dags/etl")
    assert [t["task_id"] for t in etl["tasks"]] == ["extract", "load"]
    assert etl["tasks"][1]["outlets"] == ["report"]
    assert etl["run_counts"] == {"queued": 2}
    assert len(etl["last_runs"]) == 2
    consumer = _get(world, "/api/v1/dags/consumer")
    assert consumer["assets"] == ["inbox", "report"]
    assert [(w["asset"], w["name"]) for w in consumer["watchers"]] == [("inbox", "inbox-flag")]
    assert consumer["schedule_text"] == "assets report | inbox"
    assert "'nope'" in _problem(world, "/api/v1/dags/nope", 404)


def test_runs_list_filters_and_pages(world: World) -> None:
    every = _get(world, "/api/v1/runs")
    assert every["total"] == 4
    etl = _get(world, "/api/v1/runs?dag_id=etl")
    assert [r["run_id"] for r in etl["items"]] == [world.etl_queued_run, world.etl_run]
    assert etl == _get(world, "/api/v1/dags/etl/runs")
    first = _get(world, "/api/v1/runs?dag_id=etl&limit=1&offset=1")
    assert [r["run_id"] for r in first["items"]] == [world.etl_run] and first["total"] == 2
    triggered = _get(world, "/api/v1/runs?run_type=asset_triggered")["items"]
    assert [r["dag_id"] for r in triggered] == ["consumer"]
    assert len(triggered[0]["asset_events"]) == 2
    assert _get(world, "/api/v1/runs?state=success")["total"] == 0
    assert _get(world, "/api/v1/runs?state=queued")["total"] == 4
    assert _get(world, "/api/v1/runs?since=2999-01-01T00:00:00Z")["total"] == 0
    assert _get(world, "/api/v1/runs?since=2000-01-01T00:00:00Z")["total"] == 4
    _problem(world, "/api/v1/runs?state=sleeping", 422)
    _problem(world, "/api/v1/runs?since=2000-01-01T00:00:00", 422)  # no offset
    assert "'nope'" in _problem(world, "/api/v1/dags/nope/runs", 404)


def test_run_show(world: World) -> None:
    run = _get(world, _run("etl", world.etl_run))
    assert run["conf"] == {"region": "eu"}
    assert run["tasks"] == {"extract": "success", "load": "failed"}
    assert [(t["task_id"], t["state"]) for t in run["task_instances"]] == [
        ("extract", "success"),
        ("load", "failed"),
    ]
    consumer = _get(world, _run("consumer", world.consumer_run))
    sources = sorted((e["asset"], e["source"]) for e in consumer["triggering_events"])
    assert sources == [("inbox", "watcher"), ("report", "cli")]
    _problem(world, _run("etl", "no-such-run"), 404)


def test_task_instances(world: World) -> None:
    etl = _run("etl", world.etl_run)
    listed = _get(world, f"{etl}/tasks")
    assert [(t["task_id"], t["map_index"], t["state"]) for t in listed["items"]] == [
        ("extract", -1, "success"),
        ("load", -1, "failed"),
    ]
    extract = listed["items"][0]
    assert extract["try_number"] == 2 and extract["duration_s"] == pytest.approx(30, abs=1)
    assert _get(world, f"{etl}/tasks?state=failed")["total"] == 1
    assert _get(world, f"{etl}/tasks?limit=1")["items"][0]["task_id"] == "extract"
    shown = _get(world, f"{etl}/tasks/extract")
    assert shown["logged_tries"] == [1, 2] and shown["map_indexes"] == []
    fanout = _run("fanout", world.fanout_run)
    copies = _get(world, f"{fanout}/tasks")["items"]
    assert [(t["task_id"], t["map_index"]) for t in copies] == [("one", 0), ("one", 1), ("one", 2)]
    assert _get(world, f"{fanout}/tasks/one?map_index=2")["map_indexes"] == [0, 1, 2]
    assert "map_index 0..2" in _problem(world, f"{fanout}/tasks/one", 404)
    _problem(world, f"{etl}/tasks/nope", 404)
    _problem(world, f"{_run('etl', 'no-such-run')}/tasks", 404)


def test_task_results(world: World) -> None:
    etl = _run("etl", world.etl_run)
    results = _get(world, f"{etl}/tasks/extract/results")
    assert results["results"] == {"return_value": {"rows": 3, "at": "2026-01-02T00:00:00+00:00"}}
    assert results["state"] == "success"
    assert _get(world, f"{etl}/tasks/load/results")["results"] == {}
    _problem(world, f"{etl}/tasks/nope/results", 404)


def test_task_logs_by_try_and_offset(world: World) -> None:
    logs = f"{_run('etl', world.etl_run)}/tasks/extract/logs"
    latest = _get(world, logs)
    assert latest["try_number"] == 2 and latest["tries"] == [1, 2]
    assert latest["content"] == "try 2 of extract\nrésumé ✓\n"
    assert latest["next_offset"] == latest["size"] == len(latest["content"].encode())
    assert _get(world, f"{logs}?try_number=1")["content"].startswith("try 1 of extract")
    rest = _get(world, f"{logs}?offset={latest['size'] - 4}")  # from inside "✓"'s bytes
    assert rest["next_offset"] == latest["size"]
    assert _get(world, f"{logs}?offset={latest['size']}")["content"] == ""
    assert "try 9" in _problem(world, f"{logs}?try_number=9", 404)
    _problem(world, f"{logs}?try_number=0", 422)
    _problem(world, f"{_run('etl', world.etl_run)}/tasks/load/logs", 404)  # never ran


def test_a_log_path_that_leaves_the_log_folder_is_404(world: World, tmp_path: Any) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("outside-the-log-folder", encoding="utf-8")
    from engine.task_log_files import log_path

    link = log_path(world.log_folder, "etl", world.etl_run, "load", 1)
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, link)
    try:
        answer = world.client("viewer").get(f"{_run('etl', world.etl_run)}/tasks/load/logs")
        assert answer.status_code == 404, answer.text
        assert "outside-the-log-folder" not in answer.text
        assert str(tmp_path) not in answer.text  # no server path in the answer either
    finally:
        link.unlink()
    for task in ("..%2F..%2F..%2Fetc", "..", "%2E%2E"):
        path = f"{_run('etl', world.etl_run)}/tasks/{task}/logs?try_number=1"
        assert world.client("viewer").get(path).status_code == 404


def test_assets_and_events(world: World) -> None:
    assets = {a["name"]: a for a in _get(world, "/api/v1/assets")["items"]}
    assert sorted(assets) == ["inbox", "report"]
    report = assets["report"]
    assert report["consuming_dags"] == ["consumer"]
    assert report["producing_tasks"] == ["etl/load"]
    assert report["events"] == 1 and report["last_event"]["source"] == "cli"
    inbox = assets["inbox"]
    assert inbox["watchers"][0]["triggerer_id"] == world.triggerer_id
    assert _get(world, "/api/v1/assets?search=box")["total"] == 1
    assert _get(world, "/api/v1/assets?limit=1&offset=1")["items"][0]["name"] == "report"
    _problem(world, "/api/v1/assets/nope", 404)
    events = _get(world, "/api/v1/asset-events")
    assert events["total"] == 2
    newest, oldest = events["items"]
    assert (newest["asset"], newest["source"], newest["payload"]) == (
        "inbox",
        "watcher",
        {"filename": "flag"},
    )
    assert newest["source_watcher"] == "inbox-flag"
    assert oldest["extra"] == {"by": "hand"} and oldest["created_by"] == "cli:me@h"
    assert newest["runs"] == oldest["runs"] == [f"consumer/{world.consumer_run}"]
    only = _get(world, "/api/v1/asset-events?asset=report")["items"]
    assert [e["id"] for e in only] == [oldest["id"]]
    assert _get(world, "/api/v1/asset-events?source=watcher")["total"] == 1
    assert _get(world, "/api/v1/asset-events?since=2999-01-01T00:00:00%2B00:00")["total"] == 0
    _problem(world, "/api/v1/asset-events?asset=nope", 404)
    _problem(world, "/api/v1/asset-events?source=carrier-pigeon", 422)


def test_asset_graph(world: World) -> None:
    graph = _get(world, "/api/v1/asset-graph")
    kinds = {n["id"]: n["kind"] for n in graph["nodes"]}
    assert kinds == {
        "asset:inbox": "asset",
        "asset:report": "asset",
        "watcher:inbox/inbox-flag": "watcher",
        "task:etl/load": "task",
        "dag:etl": "dag",
        "dag:consumer": "dag",
    }
    edges = {(e["source"], e["kind"], e["target"]) for e in graph["edges"]}
    assert edges == {
        ("watcher:inbox/inbox-flag", "updates", "asset:inbox"),
        ("task:etl/load", "updates", "asset:report"),
        ("dag:etl", "runs", "task:etl/load"),
        ("asset:inbox", "schedules", "dag:consumer"),
        ("asset:report", "schedules", "dag:consumer"),
    }


def test_triggers_jobs_and_streams(world: World) -> None:
    world.heartbeat()
    triggers = _get(world, "/api/v1/triggers")
    assert triggers["total"] == 1
    [trigger] = triggers["items"]
    assert trigger["id"] == world.watcher_trigger_id and trigger["kind"] == "watcher"
    assert trigger["triggerer_id"] == world.triggerer_id and trigger["owner_alive"] is True
    assert trigger["claimed_at"] is not None and trigger["serves"] == "watcher inbox/inbox-flag"
    assert _get(world, "/api/v1/triggers?kind=task")["total"] == 0
    assert _get(world, f"/api/v1/triggers?triggerer_id={world.triggerer_id}")["total"] == 1
    jobs = _get(world, "/api/v1/jobs?job_type=triggerer")["items"]
    assert [(j["id"], j["alive"], j["load"]) for j in jobs] == [(world.triggerer_id, True, 1)]
    [group] = _get(world, "/api/v1/streams")["items"]
    assert (group["key"], group["mode"], group["triggerer_id"]) == (
        STREAM_KEY,
        "ack",
        world.triggerer_id,
    )
    assert group["outstanding_by_lane"] == {"p0": 2, "p1": 1} and group["outstanding"] == 3
    assert group["advance_rate_per_s"] == pytest.approx(3.0)  # 30 events in 10 s
    assert [s["outstanding"] for s in group["history"]] == [4, 3]
    assert _get(world, "/api/v1/streams?history=false")["items"][0]["history"] is None
    assert _get(world, "/api/v1/streams?key=other")["total"] == 0


def test_the_openapi_document_describes_the_resources(world: World) -> None:
    schema = world.client("viewer").get("/api/v1/openapi.json").json()
    paths = schema["paths"]
    for path in (
        "/api/v1/dags",
        "/api/v1/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/logs",
        "/api/v1/asset-events",
        "/api/v1/streams",
    ):
        assert path in paths, path
    models = schema["components"]["schemas"]
    assert {"DagItem", "RunDetail", "TaskLog", "AssetEventItem", "StreamGroup"} <= set(models)
