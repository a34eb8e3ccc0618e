"""The UI's forms and pages refuse what the REST API refuses, with a clean 4xx and nothing
stored: a conf or extra holding NaN, an infinity, a NUL or a lone surrogate (PostgreSQL
cannot store the last two), a NUL partition key, and a partition range whose start has no
UTC value (0001-01-01 east of UTC); on both databases, against the real application.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import func, select

from engine.db.models import AssetEvent, DagRun
from tests.db_templates import migrated_copy
from tests.integration.api_support import ApiHarness, parsed_ui

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

DAGS = """
from datetime import datetime

from engine import DAG, Asset, BaseOperator


class CopyRows(BaseOperator):
    def execute(self, context):
        return 1


with DAG("copies", schedule=None, start_date=datetime(2026, 1, 1)):
    CopyRows(task_id="copy", outlets=[Asset("report")])
"""
#: JSON texts a form may be given that no database stores faithfully.
UNSTORABLE = {
    "NaN": '{"rate": NaN}',
    "Infinity": '{"limits": {"rate": 1e999}}',
    "NUL": '{"name": "a\\u0000b"}',
    "lone surrogate": '{"name": "\\ud800"}',
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def ui(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiHarness]:
    root = tmp_path_factory.mktemp("ui-limits")
    dags = root / "dags"
    dags.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS))
    with migrated_copy(request, request.param, root) as url:
        yield from parsed_ui(url, root, dags, {"ada": "admin"})


@pytest.fixture(scope="module")
def admin(ui: ApiHarness) -> tuple[TestClient, str]:
    client = ui.client()
    return client, ui.login(client, "ada")


def _count(ui: ApiHarness, model: type[DagRun] | type[AssetEvent]) -> int:
    return int(ui.db.call(lambda s: s.execute(select(func.count()).select_from(model)).scalar()))


@pytest.mark.parametrize("what", sorted(UNSTORABLE))
def test_a_trigger_conf_no_database_stores_is_refused(
    ui: ApiHarness, admin: tuple[TestClient, str], what: str
) -> None:
    client, csrf = admin
    runs = _count(ui, DagRun)
    answer = client.post(
        "/dags/copies/trigger",
        data={"csrf_token": csrf, "conf": UNSTORABLE[what], "confirmed": "yes"},
    )
    assert answer.status_code == 422, answer.text
    assert "conf" in answer.text
    assert _count(ui, DagRun) == runs


@pytest.mark.parametrize("what", sorted(UNSTORABLE))
def test_an_event_extra_no_database_stores_is_refused(
    ui: ApiHarness, admin: tuple[TestClient, str], what: str
) -> None:
    client, csrf = admin
    events = _count(ui, AssetEvent)
    answer = client.post(
        "/assets/report/events", data={"csrf_token": csrf, "extra": UNSTORABLE[what]}
    )
    assert answer.status_code == 422, answer.text
    assert "extra" in answer.text
    assert _count(ui, AssetEvent) == events


def test_a_partition_key_with_a_nul_is_refused(
    ui: ApiHarness, admin: tuple[TestClient, str]
) -> None:
    client, csrf = admin
    events = _count(ui, AssetEvent)
    answer = client.post(
        "/assets/report/events", data={"csrf_token": csrf, "partition_key": "eu\x00west"}
    )
    assert answer.status_code == 422, answer.text
    assert "NUL" in answer.text
    assert _count(ui, AssetEvent) == events


@pytest.mark.parametrize("start", ["0001-01-01T00:00+01:00", "9999-12-31T23:59-01:00"])
def test_a_partition_range_without_a_utc_value_is_a_clean_answer(
    admin: tuple[TestClient, str], start: str
) -> None:
    client, _ = admin
    answer = client.get("/assets/report", params={"pfrom": start})
    assert answer.status_code < 500, answer.text
    assert "is not an ISO date" in answer.text
