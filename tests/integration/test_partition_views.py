"""What an operator sees of partitions (in process, on parsed DAG files and the real
scheduler's runs): the key on listed events and runs (CLI and REST, with a filter), an
asset's partitions with its missing keys and each consumer's run per key (``sluice assets
partitions``, ``GET /api/v1/assets/{name}/partitions``, the asset page's matrix), and
"why" naming the hours a daily rollup still waits for."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from engine.config import load_config
from engine.db.queries import assets as assets_sql
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from tests.integration.api_support import ApiHarness, api_harness, bearer
from tests.integration.harness import parsed_database
from tests.integration.test_backfill import run_cli

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi.testclient import TestClient

    from engine.config import Config
    from engine.db.database import Database

pytestmark = pytest.mark.integration

DAGS = """
from datetime import datetime

from engine import (
    DAG, AllowedKeyMapper, Asset, CronPartitionTimetable, DayWindow,
    PartitionedAssetTimetable, RollupMapper, StartOfDayMapper, task,
)

hourly = Asset("hourly")


@task(outlets=[hourly])
def produce():
    return 1


@task
def consume():
    return 2


with DAG(
    "producer",
    schedule=CronPartitionTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 3, 1),
):
    produce()

with DAG("per_hour", schedule=PartitionedAssetTimetable(assets=hourly)):
    consume()

daily = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
by_day = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=daily)
with DAG("per_day", schedule=by_day):
    consume()

with DAG(
    "noon_only",
    schedule=PartitionedAssetTimetable(
        assets=hourly, default_partition_mapper=AllowedKeyMapper(["2026-03-10T12:00:00"])
    ),
):
    consume()

with DAG("whole", schedule=[hourly]):
    consume()
"""

HOURS = [f"2026-03-10T{hour:02d}:00:00" for hour in range(24)]
LEFT_OUT = ("2026-03-10T05:00:00", "2026-03-10T17:00:00")


class World:
    def __init__(self, api: ApiHarness, config: Config, token: str) -> None:
        self.api, self.db, self.config, self.token = api, api.db, config, token
        self._page: TestClient | None = None

    def get(self, path: str, **params: Any) -> Any:
        answer = self.api.client().get(f"/api/v1{path}", params=params, headers=bearer(self.token))
        assert answer.status_code == 200, answer.text
        return answer.json()

    def page(self) -> TestClient:
        """A UI client logged in as a viewer (the same one for the whole test)."""
        if self._page is None:
            self.api.user("ui-viewer", "viewer")
            self._page = self.api.client()
            self.api.login(self._page, "ui-viewer")
        return self._page

    def cli(self, *args: str) -> Any:
        result = run_cli(self.config, *args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


def _emit(db: Database, key: str | None) -> int:
    return db.call(
        lambda s: assets_sql.emit_asset_event(
            s, "hourly", extra=None, source="cli", created_by="test", partition_key=key
        )
    )


@pytest.fixture
def world(migrated_db_url: str, tmp_path: Path) -> Iterator[World]:
    """22 of the 24 hours of 2026-03-10 arrived (not 05:00 and 17:00), and one event without
    a key; the scheduler made its runs."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "partitions.py").write_text(DAGS)
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    for key in HOURS:
        if key not in LEFT_OUT:
            _emit(parsed.db, key)
    _emit(parsed.db, None)
    scheduler = Scheduler(db=parsed.db, cipher=parsed.cipher, settings=SchedulerSettings())
    anyio.run(scheduler.schedule_once)
    parsed.db.dispose()
    api = api_harness(migrated_db_url, tmp_path)
    api.user("vic", "viewer")
    environ = {"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__SQL_ALCHEMY_CONN": api.db.url}
    try:
        yield World(api, load_config(environ=environ), api.token("vic"))
    finally:
        api.db.dispose()


def test_events_and_runs_show_their_key_and_filter_by_it(world: World) -> None:
    noon = HOURS[12]
    events = world.cli("assets", "events", "hourly")
    assert [e["partition_key"] for e in events] == [k for k in HOURS if k not in LEFT_OUT] + [None]
    only = world.cli("assets", "events", "hourly", "--partition-key", noon)
    assert [e["partition_key"] for e in only] == [noon]
    runs = world.cli("runs", "list", "per_hour")
    assert len(runs) == 22 and {r["partition_key"] for r in runs} == set(HOURS) - set(LEFT_OUT)
    [run] = world.cli("runs", "list", "per_hour", "--partition-key", noon)
    assert run["run_type"] == "asset_triggered"
    assert world.cli("dags", "show", "noon_only")["last_runs"][0]["partition_key"] == noon

    page = world.get("/asset-events", asset="hourly", partition_key=noon)
    assert [e["partition_key"] for e in page["items"]] == [noon]
    listed = world.get("/dags/per_hour/runs", partition_key=noon)
    assert [r["run_id"] for r in listed["items"]] == [run["run_id"]]
    assert listed["items"][0]["partition_key"] == noon
    assert world.get("/runs", partition_key=noon)["total"] == 2  # per_hour and noon_only
    shown = world.get(f"/dags/per_hour/runs/{run['run_id']}")
    assert shown["partition_key"] == noon
    assert [e["partition_key"] for e in shown["triggering_events"]] == [noon]
    assert world.get("/assets/hourly")["last_event"]["partition_key"] is None  # the unkeyed one


def _cells(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cell["dag_id"]: cell for cell in row["consumers"]}


@pytest.mark.both_databases  # the module's broad test on PostgreSQL too
def test_assets_partitions_lists_each_key_with_each_consumers_run(world: World) -> None:
    shown = world.cli("assets", "partitions", "hourly")
    assert shown["total"] == 22 and shown["unkeyed_events"] == 1 and shown["range"] is None
    assert [row["partition_key"] for row in shown["items"]] == sorted(
        set(HOURS) - set(LEFT_OUT), reverse=True
    )
    consumers = {c["dag_id"]: c for c in shown["consumers"]}
    assert {d for d, c in consumers.items() if c["partitioned"]} == {
        "per_hour",
        "per_day",
        "noon_only",
    }
    assert consumers["whole"] == {
        "dag_id": "whole",
        "partitioned": False,
        "mapper": None,
        "error": None,
    }
    rows = {row["partition_key"]: row for row in shown["items"]}
    noon, eleven = _cells(rows[HOURS[12]]), _cells(rows[HOURS[11]])
    assert rows[HOURS[12]]["events"] == 1 and rows[HOURS[12]]["last_event"]["source"] == "cli"
    active = {"queued", "running"}
    assert noon["per_hour"]["state"] in active
    assert noon["per_hour"]["downstream_keys"] == [HOURS[12]]
    assert noon["noon_only"]["state"] in active
    # The rollup waits: no run of the day yet, the hour's event still queued for it.
    assert noon["per_day"] == {
        "dag_id": "per_day",
        "downstream_keys": ["2026-03-10"],
        "state": None,
        "run_id": None,
        "runs": 0,
        "waiting": True,
        "error": None,
    }
    assert eleven["noon_only"]["state"] is None
    assert (
        "'2026-03-10T11:00:00' is not an allowed key of AllowedKeyMapper"
        in (eleven["noon_only"]["error"])
    )


def test_a_range_lists_the_producers_expected_keys_and_marks_the_missing(world: World) -> None:
    shown = world.cli("assets", "partitions", "hourly", "--from", "2026-03-10", "--to", HOURS[23])
    assert shown["range"]["expected"] == 24 and shown["range"]["missing"] == 2
    assert shown["producers"] == [{"dag_id": "producer", "timetable": "0 * * * *"}]
    assert [r["partition_key"] for r in shown["items"]] == sorted(HOURS, reverse=True)
    missing = [r["partition_key"] for r in shown["items"] if r["missing"]]
    assert missing == sorted(LEFT_OUT, reverse=True)
    five = next(r for r in shown["items"] if r["partition_key"] == LEFT_OUT[0])
    assert five["events"] == 0 and five["last_event"] is None
    assert _cells(five)["per_hour"]["state"] is None and not _cells(five)["per_hour"]["waiting"]

    text = run_cli(world.config, "assets", "partitions", "hourly", "--from", "2026-03-10",
                   "--to", HOURS[23])  # fmt: skip
    assert text.exit_code == 0, text.output
    assert "24 key(s) expected by producer (0 * * * *), 2 missing" in text.stdout
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith(LEFT_OUT[1]))
    assert "MISSING" in line
    noon = next(ln for ln in text.stdout.splitlines() if ln.startswith(HOURS[12]))
    assert "2026-03-10: waiting" in noon and "refused" not in noon

    api = world.get("/assets/hourly/partitions", **{"from": "2026-03-10T00:00:00Z",
                    "to": "2026-03-10T23:00:00Z", "limit": 5})  # fmt: skip
    assert api["total"] == 24 and len(api["items"]) == 5 and api["range"]["missing"] == 2
    assert api["items"][0]["partition_key"] == HOURS[23]


def test_a_range_that_cannot_be_listed_is_refused_with_the_reason(world: World) -> None:
    backwards = run_cli(world.config, "assets", "partitions", "hourly", "--from", "2026-03-10",
                        "--to", "2026-03-09")  # fmt: skip
    assert backwards.exit_code == 1 and "before it starts" in backwards.stderr
    answer = world.api.client().get(
        "/api/v1/assets/hourly/partitions",
        params={"from": "2026-03-01T00:00:00Z", "to": "2028-01-01T00:00:00Z"},
        headers=bearer(world.token),
    )
    assert answer.status_code == 422 and "more than 10000 ticks" in answer.text
    unknown = world.api.client().get("/api/v1/assets/nope/partitions", headers=bearer(world.token))
    assert unknown.status_code == 404


ROLLUP_WAIT = (
    "2026-03-10: waiting for 2 of 24 hourly keys of asset hourly: 2026-03-10T05:00:00, "
    "2026-03-10T17:00:00"
)


def test_why_names_the_hours_a_daily_rollup_still_waits_for(world: World) -> None:
    why = world.cli("dags", "why", "per_day")
    assert why["schedule"]["kind"] == "assets" and why["schedule"]["time"] is None
    parts = why["schedule"]["partitions"]
    assert parts["ready"] == [] and parts["waiting_total"] == 1 and parts["refused"] == []
    [wait] = parts["waiting"]
    assert wait["message"] == ROLLUP_WAIT
    assert wait["events"] == 22 and wait["missing_assets"] == []
    assert wait["rollups"] == [
        {
            "asset": "hourly",
            "grain": "hourly",
            "expected": 24,
            "arrived": 22,
            "missing_keys": list(LEFT_OUT),
            "wait_policy": "WaitForAll()",
            "needed": None,
        }
    ]
    findings = {f["code"]: f for f in why["findings"]}
    assert findings["partitions_waiting"]["message"] == ROLLUP_WAIT
    assert findings["partitions_waiting"]["severity"] == "waiting"
    text = run_cli(world.config, "dags", "why", "per_day")
    assert text.exit_code == 0, text.output
    assert f"    {ROLLUP_WAIT}" in text.stdout and "  waiting: 1 key(s)" in text.stdout
    assert world.get("/dags/per_day/why")["schedule"]["partitions"] == parts

    for key in LEFT_OUT:  # the last two hours arrive: the day is ready
        _emit(world.db, key)
    ready = world.cli("dags", "why", "per_day")
    assert ready["schedule"]["partitions"]["ready"] == ["2026-03-10"]
    assert ready["schedule"]["assets"]["met"] is True
    met = next(f for f in ready["findings"] if f["code"] == "condition_met")
    assert "met for partition key(s) 2026-03-10" in met["message"]


def test_the_why_page_lists_the_waiting_partition_keys(world: World) -> None:
    html = world.page().get("/dags/per_day/why").text
    assert 'data-testid="partition-waits"' in html
    assert '<tr data-partition="2026-03-10">' in html
    assert ROLLUP_WAIT.split(": ", 1)[1] in html


def _matrix_html(world: World, **params: Any) -> tuple[int, str]:
    answer = world.page().get("/assets/hourly", params=params)
    return answer.status_code, answer.text


def _row(html: str, name: str) -> list[str]:
    """The data-state of each cell of the matrix row ``name``, left to right."""
    row = html.split(f'<tr data-row="{name}">', 1)[1].split("</tr>", 1)[0]
    return re.findall(r'data-state="([^"]+)"', row)


def test_the_asset_page_draws_the_partition_matrix(world: World) -> None:
    status, html = _matrix_html(world)
    assert status == 200 and 'data-testid="partition-matrix"' in html
    columns = re.findall(r'<th scope="col" class="run" data-partition="([^"]+)"', html)
    assert columns == sorted(set(HOURS) - set(LEFT_OUT), reverse=True)  # newest first
    assert _row(html, "latest event") == ["updated"] * 22
    assert _row(html, "per_day") == ["waiting"] * 22  # each hour waits for the day's rollup
    assert set(_row(html, "per_hour")) <= {"queued", "running"}
    noon = _row(html, "noon_only")
    assert noon[columns.index(HOURS[12])] in {"queued", "running"}
    assert noon.count("refused") == 21
    assert '<tr data-row="whole">' not in html and "runs on the whole asset" in html
    assert "1 event without a key" in html


def test_the_matrix_marks_the_missing_keys_of_a_range_and_pages(world: World) -> None:
    _, html = _matrix_html(world, pfrom="2026-03-10", pto="2026-03-10T23:00")
    columns = re.findall(r'class="run" data-partition="([^"]+)"', html)
    assert columns == sorted(HOURS, reverse=True)
    events = _row(html, "latest event")
    assert [columns[i] for i, s in enumerate(events) if s == "missing"] == sorted(
        LEFT_OUT, reverse=True
    )
    assert "2 missing" in html
    _, paged = _matrix_html(world, pfrom="2026-03-10", pto="2026-03-10T23:00", poffset=20)
    assert re.findall(r'class="run" data-partition="([^"]+)"', paged) == HOURS[3::-1]
    status, bad = _matrix_html(world, pfrom="yesterday")
    assert status == 422 and "is not an ISO date" in bad


def test_the_asset_events_table_shows_and_filters_by_partition(world: World) -> None:
    _, html = _matrix_html(world, partition_key=HOURS[12])
    table = html.split('data-testid="asset-events"', 1)[1]
    assert table.count('<tr id="event-') == 1
    assert f'<td class="partition-key"><code>{HOURS[12]}</code></td>' in table


def test_a_dag_on_a_partitioned_asset_timetable_shows_its_schedule_per_key(world: World) -> None:
    text = run_cli(world.config, "dags", "list")
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("per_day "))
    assert "assets hourly, per partition key" in line
    assert world.cli("dags", "why", "per_day")["schedule"]["text"] == (
        "assets hourly, per partition key"
    )


def test_the_asset_page_emits_an_event_of_one_partition(world: World) -> None:
    world.api.user("otto", "op")
    client = world.api.client()
    csrf = world.api.login(client, "otto")
    key = "2026-03-11T00:00:00"
    answer = client.post(
        "/assets/hourly/events", data={"csrf_token": csrf, "extra": "", "partition_key": key}
    )
    assert answer.status_code == 303, answer.text
    [event] = world.cli("assets", "events", "hourly", "--partition-key", key)
    assert event["created_by"] == "ui:otto" and event["source"] == "api"
    too_long = client.post(
        "/assets/hourly/events", data={"csrf_token": csrf, "partition_key": "k" * 251}
    )
    assert too_long.status_code == 422 and "more than the 250" in too_long.text
    assert world.cli("assets", "events", "hourly", "--partition-key", "k" * 251) == []
