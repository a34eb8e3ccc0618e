"""The graph, Gantt, code, results and trigger-form pages against the real application and
a parsed SQLite database, in process: what each draws, which link goes where, the params
form's errors next to their fields and the confirmation before a run is made. The browser
tests (tests/browser/test_ui_views.py) drive the same pages in Chromium."""

from __future__ import annotations

import html
import re
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select, update

from engine.crypto import KwargsCipher
from engine.db.models import DagRun, TaskInstance, utcnow
from engine.db.queries import actions
from engine.views import operations
from tests.db_templates import copy_sqlite_template
from tests.integration.api_support import ApiHarness, api_harness
from tests.integration.harness import parse_in_process
from triggers.serde import serialize_value

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi.testclient import TestClient

pytestmark = pytest.mark.integration

DAGS = """
from datetime import datetime

from engine import DAG, Label, Param, TaskGroup, task

with DAG(
    "shaped",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    doc_md="# Shaped\\n<script>alert(1)</script> *docs*",
    params={
        "region": Param("eu", type="string", description="Where from."),
        "size": Param(10, type="integer", minimum=1),
        "rate": Param(0.5, type="number", maximum=1),
        "dry": Param(False, type="boolean"),
        "mode": Param("a", enum=["a", "b"]),
        "tables": Param(["x"], type="array"),
    },
):
    @task
    def start():
        return {"rows": 3, "note": "<b>bold</b>"}

    @task
    def skip():
        return None

    with TaskGroup("load") as load:
        @task
        def stage():
            return 1

        @task
        def publish():
            return 2

        stage() >> publish()

    first = start()
    first >> Label("go on") >> load
    first >> Label("stop") >> skip()
"""


def _world(root: Path, sqlite_template: Path) -> ApiHarness:
    dags = root / "dags"
    dags.mkdir()
    (dags / "shaped.py").write_text(textwrap.dedent(DAGS))
    url = copy_sqlite_template(sqlite_template, root / "sluice.db")
    api = api_harness(url, root)
    # the key the app decrypts the stored source with (made in its home, as the engine does)
    cipher = KwargsCipher.from_config(api.config.core.fernet_key, api.config.home)
    parse_in_process(api.db, cipher, dags)
    api.user("ada", "admin")
    api.user("otto", "op")
    api.user("vic", "viewer")
    return api


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[ApiHarness]:
    api = _world(tmp_path_factory.mktemp("ui-views"), sqlite_template)
    try:
        yield api
    finally:
        api.db.dispose()


@pytest.fixture(scope="module")
def run_id(ui: ApiHarness) -> str:
    """A run of ``shaped``: start succeeded (with a result), load.stage failed, the rest
    not run."""
    now = utcnow()

    def make(session):
        made = operations.trigger_dag(
            session, "shaped", conf=None, logical_date=now - timedelta(hours=1), now=now
        )
        run_id = made["run_id"]
        for task_id, state in (("start", "success"), ("load.stage", "failed")):
            actions.set_task_state(session, "shaped", run_id, task_id, state, now=now)
        run_pk = session.execute(
            select(DagRun.id).where(DagRun.dag_id == "shaped", DagRun.run_id == run_id)
        ).scalar_one()
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == run_pk, TaskInstance.task_id == "start")
            .values(
                xcoms={"return_value": serialize_value({"rows": 3, "note": "<b>bold</b>"})},
                queued_at=now - timedelta(seconds=40),
                start_date=now - timedelta(seconds=30),
                end_date=now - timedelta(seconds=10),
            )
        )
        return run_id

    return str(ui.db.call(make))


def logged_in(api: ApiHarness, username: str) -> tuple[TestClient, str]:
    client = api.client()
    return client, api.login(client, username)


def run_count(api: ApiHarness) -> int:
    query = select(DagRun.id).where(DagRun.dag_id == "shaped")
    return len(api.db.call(lambda s: s.execute(query).scalars().all()))


def test_the_graph_draws_tasks_labels_and_states_of_the_newest_run(
    ui: ApiHarness, run_id: str
) -> None:
    client, _ = logged_in(ui, "vic")
    page = client.get("/dags/shaped/graph")
    assert page.status_code == 200, page.text
    text = page.text
    for task_id in ("start", "skip", "load.stage", "load.publish"):
        assert f'data-id="{task_id}"' in text
    assert 'data-source="start" data-target="load.stage"' in text
    assert ">go on</text>" in text and ">stop</text>" in text
    assert re.search(r'data-id="start" data-state="success" href="[^"]+/tasks/start"', text)
    assert 'data-id="load.stage" data-state="failed"' in text
    assert 'data-id="skip" data-state="none"' in text
    assert html.escape(run_id, quote=False) in text
    assert 'data-group="load" data-folded="no"' in text
    assert 'name="sluice-refresh"' in text  # the run is still queued: the page follows it


def test_a_folded_group_is_one_node_with_its_most_pressing_state(
    ui: ApiHarness, run_id: str
) -> None:
    client, _ = logged_in(ui, "vic")
    text = client.get("/dags/shaped/graph", params={"fold": "load", "run_id": run_id}).text
    assert 'data-id="load.stage"' not in text
    assert re.search(r'data-kind="group" data-id="load" data-state="failed"', text)
    assert 'data-source="start" data-target="load"' in text and ">go on</text>" in text
    unfold = re.search(r'data-id="load" data-state="failed" href="([^"]+)"', text)
    assert unfold is not None and "fold=" not in html.unescape(unfold.group(1))
    assert 'data-group="load" data-folded="yes"' in text


def test_the_graph_answers_404_for_an_unknown_dag_or_run(ui: ApiHarness) -> None:
    client, _ = logged_in(ui, "vic")
    assert client.get("/dags/nope/graph").status_code == 404
    assert client.get("/dags/shaped/graph", params={"run_id": "nope"}).status_code == 404


def test_the_gantt_chart_has_a_bar_per_task_instance(ui: ApiHarness, run_id: str) -> None:
    client, _ = logged_in(ui, "vic")
    page = client.get(f"/dags/shaped/runs/{run_id}/gantt")
    assert page.status_code == 200, page.text
    bar = r'<a class="bar [^"]*" href="[^"]+" data-task="start".*?</a>'
    start = re.search(bar, page.text, re.S)
    assert start is not None
    assert 'class="run"' in start.group(0) and 'class="wait"' in start.group(0)
    assert "waited 10.0 s, ran 20.0 s" in start.group(0)
    assert 'data-task="skip"' in page.text
    assert 'name="sluice-refresh"' in page.text  # live while the run goes on
    assert client.get("/dags/shaped/runs/nope/gantt").status_code == 404


def test_the_code_page_shows_the_source_with_line_numbers_and_escaped_docs(
    ui: ApiHarness,
) -> None:
    client, _ = logged_in(ui, "vic")
    page = client.get("/dags/shaped/code")
    assert page.status_code == 200, page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "<script>alert(1)" not in page.text
    assert 'id="L1"' in page.text and "TaskGroup(&#34;load&#34;)" in page.text
    assert client.get("/dags/nope/code").status_code == 404


def test_the_results_page_shows_each_key_as_json(ui: ApiHarness, run_id: str) -> None:
    client, _ = logged_in(ui, "vic")
    page = client.get(f"/dags/shaped/runs/{run_id}/tasks/start/results")
    assert page.status_code == 200, page.text
    assert 'data-key="return_value"' in page.text
    assert "&#34;note&#34;: &#34;&lt;b&gt;bold&lt;/b&gt;&#34;" in page.text
    empty = client.get(f"/dags/shaped/runs/{run_id}/tasks/skip/results")
    assert empty.status_code == 200 and "No result" in empty.text
    missing = client.get(f"/dags/shaped/runs/{run_id}/tasks/nope/results")
    assert missing.status_code == 404
    huge = client.get(
        f"/dags/shaped/runs/{run_id}/tasks/start/results", params={"map_index": 10**20}
    )
    assert huge.status_code == 422


def test_the_trigger_form_has_a_field_per_param_with_its_default(ui: ApiHarness) -> None:
    client, _ = logged_in(ui, "otto")
    page = client.get("/dags/shaped/trigger")
    assert page.status_code == 200, page.text
    text = page.text
    assert 'name="param:region" value="eu" type="text"' in text
    assert 'name="param:size" value="10" type="number" step="1"' in text
    assert 'name="param:rate" value="0.5" type="number" step="any"' in text
    assert re.search(r'type="checkbox" id="param-\d" name="param:dry">', text)
    assert '<option value="&#34;a&#34;" selected>a</option>' in text
    assert "[\n  &#34;x&#34;\n]</textarea>" in text
    assert "Where from." in text
    viewer, _ = logged_in(ui, "vic")
    assert viewer.get("/dags/shaped/trigger").status_code == 403


def _form(csrf: str, **fields: str) -> dict[str, str]:
    base = {
        "csrf_token": csrf,
        "form": "params",
        "param:region": "eu",
        "param:size": "10",
        "param:rate": "0.5",
        "param:mode": '"a"',
        "param:tables": '["x"]',
        "conf": "",
    }
    return {**base, **{f"param:{k}": v for k, v in fields.items()}}


def test_bad_values_are_shown_next_to_their_fields_and_kept(ui: ApiHarness) -> None:
    client, csrf = logged_in(ui, "otto")
    before = run_count(ui)
    answer = client.post(
        "/dags/shaped/trigger",
        data=_form(csrf, size="0", rate="lots", tables="[1,"),
    )
    assert answer.status_code == 422, answer.text
    fields = dict(re.findall(r'data-param="([^"]+)">(.*?)</div>\s*</div>', answer.text, re.S))
    assert "less than the minimum 1" in fields["size"]
    assert "&#39;lots&#39; is not a number" in fields["rate"]
    assert "not valid JSON" in fields["tables"]
    assert 'role="alert"' not in fields["region"]
    assert 'value="lots"' in fields["rate"] and "[1,</textarea>" in fields["tables"]
    assert run_count(ui) == before


def test_a_valid_form_is_confirmed_then_creates_the_run_with_that_conf(ui: ApiHarness) -> None:
    client, csrf = logged_in(ui, "otto")
    before = run_count(ui)
    review = client.post(
        "/dags/shaped/trigger",
        data={**_form(csrf, size="25", dry="on", mode='"b"'), "conf": '{"extra": 1}'},
    )
    assert review.status_code == 200, review.text
    assert "Create the run" in review.text
    assert run_count(ui) == before  # nothing made before the confirmation
    confirm = r'name="conf" value="([^"]+)">\s*<input type="hidden" name="confirmed"'
    hidden = re.search(confirm, review.text)
    assert hidden is not None
    conf = html.unescape(hidden.group(1))
    assert '"size": 25' in conf and '"dry": true' in conf and '"mode": "b"' in conf
    assert '"extra": 1' in conf
    made = client.post(
        "/dags/shaped/trigger", data={"csrf_token": csrf, "conf": conf, "confirmed": "yes"}
    )
    assert made.status_code == 303, made.text
    assert made.headers["location"].startswith("/dags/shaped/runs/manual__")
    assert run_count(ui) == before + 1
    stored = ui.db.call(
        lambda s: (
            s.execute(
                select(DagRun.conf).where(DagRun.dag_id == "shaped").order_by(DagRun.id.desc())
            )
            .scalars()
            .first()
        )
    )
    assert stored["size"] == 25 and stored["dry"] is True and stored["extra"] == 1


def test_a_bare_conf_is_checked_against_the_params_and_edit_refills_the_form(
    ui: ApiHarness,
) -> None:
    client, csrf = logged_in(ui, "otto")
    bad = client.post("/dags/shaped/trigger", data={"csrf_token": csrf, "conf": '{"size": -3}'})
    assert bad.status_code == 422
    assert re.search(r'data-param="size">.*?less than the minimum', bad.text, re.S)
    edit = client.post(
        "/dags/shaped/trigger",
        data={"csrf_token": csrf, "conf": '{"size": 7, "other": true}', "edit": "yes"},
    )
    assert edit.status_code == 200
    assert 'name="param:size" value="7"' in edit.text
    assert "&#34;other&#34;: true" in edit.text  # the key no param names, in the textarea


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/dags/shaped/graph", {"run_id": "r" * 251}),
        ("/dags/shaped/graph", {"fold": [f"g{i}" for i in range(201)]}),
        ("/dags/shaped/runs/r/tasks/start/results", {"map_index": -2}),
        ("/dags/shaped/runs/r/tasks/start/results", {"map_index": "x"}),
    ],
)
def test_bad_query_values_get_a_4xx_not_a_500(
    ui: ApiHarness, path: str, params: dict[str, object]
) -> None:
    client, _ = logged_in(ui, "vic")
    assert client.get(path, params=params).status_code == 422


def test_a_trigger_post_for_an_unknown_dag_is_a_404(ui: ApiHarness) -> None:
    client, csrf = logged_in(ui, "otto")
    assert client.post("/dags/nope/trigger", data={"csrf_token": csrf}).status_code == 404
    assert client.get("/dags/nope/trigger").status_code == 404
