"""The REST API's actions against the real database (SQLite and PostgreSQL): pause and
unpause, trigger with conf, cancel a run, clear, set a task's state, POST an asset event;
404 for unknown ids, 409 for a change the state does not allow, 422 for bad input, and
no change at all from a viewer or without credentials."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest

from engine.db.models import AssetEvent
from tests.integration.api_world import World, build_world, world_database

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world_url(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[str]:
    yield from world_database(request, tmp_path_factory, "actions")


@pytest.fixture(scope="module")
def world(world_url: str, tmp_path_factory: Any) -> Iterator[World]:
    built = build_world(world_url, tmp_path_factory.mktemp("actions-world"))
    yield built
    built.api.db.dispose()


def _run(dag_id: str, run_id: str) -> str:
    return f"/api/v1/dags/{dag_id}/runs/{quote(run_id, safe='')}"


def _post(world: World, path: str, body: Any = None, *, role: str = "op", status: int = 200) -> Any:
    answer = world.client(role).post(path, json=body)
    assert answer.status_code == status, (path, answer.status_code, answer.text)
    if status >= 400:
        assert answer.headers["content-type"].startswith(PROBLEM)
    return answer.json()


def _mutations(world: World) -> list[tuple[str, Any]]:
    etl = _run("etl", world.etl_run)
    return [
        ("/api/v1/dags/hourly/pause", None),
        ("/api/v1/dags/hourly/unpause", None),
        ("/api/v1/dags/etl/runs", {"conf": {"a": 1}}),
        (f"{_run('etl', world.etl_queued_run)}/cancel", None),
        ("/api/v1/dags/etl/clear", {"run_id": world.etl_run}),
        (f"{etl}/tasks/load/clear", {}),
        (f"{etl}/tasks/load/state", {"state": "success"}),
        ("/api/v1/asset-events", {"asset": "report"}),
    ]


def test_a_viewer_or_nobody_cannot_change_anything(world: World) -> None:
    before = world.client().get("/api/v1/runs").json()
    events = world.client().get("/api/v1/asset-events").json()["total"]
    for path, body in _mutations(world):
        assert "viewer" in _post(world, path, body, role="viewer", status=403)["detail"]
        anonymous = world.api.client().post(path, json=body)
        assert anonymous.status_code == 401, path
        wrong = world.api.client().post(path, json=body, headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401, path
    assert world.client().get("/api/v1/runs").json() == before
    assert world.client().get("/api/v1/asset-events").json()["total"] == events
    assert world.client().get("/api/v1/dags/hourly").json()["paused"] is False


def test_pause_and_unpause(world: World) -> None:
    assert _post(world, "/api/v1/dags/hourly/pause") == {"dag_id": "hourly", "paused": True}
    hourly = world.client("viewer").get("/api/v1/dags/hourly").json()
    assert hourly["paused"] is True and hourly["next_run"] == "paused"
    assert world.client().get("/api/v1/dags?paused=true").json()["total"] == 1
    assert _post(world, "/api/v1/dags/hourly/unpause")["paused"] is False
    assert world.client().get("/api/v1/dags/hourly").json()["paused"] is False
    assert "'nope'" in _post(world, "/api/v1/dags/nope/pause", status=404)["detail"]


def test_trigger_with_conf(world: World) -> None:
    made = _post(world, "/api/v1/dags/fanout/runs", {"conf": {"n": [1, 2]}}, status=201)
    run = world.client().get(_run("fanout", made["run_id"])).json()
    assert (run["run_type"], run["state"], run["conf"]) == ("manual", "queued", {"n": [1, 2]})
    dated = {"logical_date": "2026-03-01T06:00:00+01:00"}
    at = _post(world, "/api/v1/dags/fanout/runs", dated, status=201)
    assert at["logical_date"] == "2026-03-01T05:00:00+00:00"
    again = _post(world, "/api/v1/dags/fanout/runs", dated, status=409)["detail"]
    assert "already has a run" in again and "logical_date" in again
    assert _post(world, "/api/v1/dags/fanout/runs", status=201)["dag_id"] == "fanout"
    assert "'nope'" in _post(world, "/api/v1/dags/nope/runs", {}, status=404)["detail"]
    for bad in ({"conf": [1, 2]}, {"conf": "x"}, {"logical_date": "2026-03-01T06:00:00"},
                {"config": {}}, {"partition_key": "k" * 251}):  # fmt: skip
        _post(world, "/api/v1/dags/fanout/runs", bad, status=422)
    keyed = _post(world, "/api/v1/dags/fanout/runs", {"partition_key": "us"}, status=201)
    assert keyed["partition_key"] == "us"  # any DAG's manual run may carry a key (Airflow)
    malformed = world.client("op").post(
        "/api/v1/dags/fanout/runs",
        content=b'{"conf": {',
        headers={"Content-Type": "application/json"},
    )
    assert malformed.status_code == 422


def test_cancel_a_run(world: World) -> None:
    path = f"{_run('etl', world.etl_queued_run)}/cancel"
    ended = _post(world, path)
    assert (ended["state"], ended["new_state"]) == ("queued", "failed")
    assert {(t["task_id"], t["new_state"]) for t in ended["tasks"]} == {
        ("extract", "skipped"),
        ("load", "skipped"),
    }
    assert "already ended" in _post(world, path, status=409)["detail"]
    assert world.client().get(_run("etl", world.etl_queued_run)).json()["state"] == "failed"
    _post(world, f"{_run('etl', 'no-such-run')}/cancel", status=404)


def test_clear_and_set_state(world: World) -> None:
    etl = _run("etl", world.etl_run)
    clear = {"run_id": world.etl_run, "only_failed": True, "dry_run": True}
    dry = _post(world, "/api/v1/dags/etl/clear", clear)
    assert dry["dry_run"] is True
    assert [(t["task_id"], t["state"]) for t in dry["tasks"]] == [("load", "failed")]
    assert world.client().get(f"{etl}/tasks/load").json()["state"] == "failed"
    done = _post(world, "/api/v1/dags/etl/clear", {**clear, "dry_run": False})
    assert [(t["task_id"], t["new_state"]) for t in done["tasks"]] == [("load", "none")]
    marked = _post(world, f"{etl}/tasks/load/state", {"state": "failed"})
    assert [(t["task_id"], t["new_state"]) for t in marked["tasks"]] == [("load", "failed")]
    cleared = _post(world, f"{etl}/tasks/load/clear", {"dry_run": True})
    assert [t["task_id"] for t in cleared["tasks"]] == ["load"]
    both = _post(world, f"{etl}/tasks/extract/clear", {"downstream": True, "dry_run": True})
    assert sorted(t["task_id"] for t in both["tasks"]) == ["extract", "load"]
    success = _post(world, f"{etl}/tasks/load/state", {"state": "success"})
    assert [t["new_state"] for t in success["tasks"]] == ["success"]
    _post(world, f"{etl}/tasks/load/state", {"state": "running"}, status=422)
    _post(world, f"{etl}/tasks/nope/state", {"state": "success"}, status=404)
    _post(world, f"{etl}/tasks/nope/clear", {}, status=404)
    _post(world, "/api/v1/dags/etl/clear", {"task_regex": "("}, status=422)
    _post(world, "/api/v1/dags/nope/clear", {}, status=404)
    _post(world, "/api/v1/dags/etl/clear", {"run_id": "no-such-run"}, status=404)


def test_post_an_asset_event(world: World) -> None:
    emitted = _post(
        world, "/api/v1/asset-events", {"asset": "report", "extra": {"k": 1}}, status=201
    )
    assert emitted["created_by"] == "api:op-user"
    [event] = world.client().get("/api/v1/asset-events?source=api").json()["items"]
    assert (event["id"], event["asset"], event["extra"]) == (
        emitted["event_id"],
        "report",
        {"k": 1},
    )
    assert event["created_by"] == "api:op-user"
    assert (
        "unknown asset 'nope'"
        in _post(world, "/api/v1/asset-events", {"asset": "nope"}, status=404)["detail"]
    )
    for bad in ({"asset": "report", "extra": [1]}, {"extra": {}}, {"asset": "report", "x": 1}):
        _post(world, "/api/v1/asset-events", bad, status=422)
    keyed = _post(
        world, "/api/v1/asset-events", {"asset": "report", "partition_key": "us"}, status=201
    )
    assert keyed["partition_key"] == "us"
    stored = world.api.db.call(lambda s: s.get(AssetEvent, keyed["event_id"]))
    assert stored is not None and stored.partition_key == "us"
    for key in ("", "k" * 251, 7):
        _post(world, "/api/v1/asset-events", {"asset": "report", "partition_key": key}, status=422)
    too_big = json.dumps({"asset": "report", "extra": {"blob": "x" * 2_000_000}})
    answer = world.client("op").post(
        "/api/v1/asset-events", content=too_big, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 413
