"""Real Airflow 3 DAG files, ported by their imports, parse and run as in Airflow: the DAG
processor's children answer top-level ``Variable.get`` / ``Connection.get`` (and mask the
secrets in a parse error), native template rendering, DAG macros / filters /
``template_searchpath``, an ``XComArg`` as the whole ``op_args`` / ``op_kwargs``, and
``Param(format=...)`` checked when a run is triggered. SQLite and PostgreSQL; the DAG
processor's real children, the real scheduler and executor in this process."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db.database import Database
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import connections as store
from engine.db.queries import dags as dags_sql
from engine.exceptions import OperatorActionError
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.views import operations
from tests.integration.harness import fast_executor_settings, running_executor
from tests.integration.test_backfill import run_cli
from tests.waiting import eventually
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

PASSWORD = "s3cr3t-pa55word"

PORTED = """
import os
from datetime import datetime

from engine import DAG, Connection, Param, PythonOperator, Variable, task

# top-level reads, as real Airflow 3 DAG files do
REGIONS = Variable.get("regions", deserialize_json=True)
WAREHOUSE = Connection.get("warehouse")
OWNER = Variable.get("owner", default="nobody")
assert "SLUICE__CORE__FERNET_KEY" not in os.environ, "the Fernet key reached the DAG file"


def show(ids, limit, sql, label, host):
    return {"ids": ids, "limit": limit, "sql": sql, "label": label, "host": host}


with DAG(
    "ported",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    render_template_as_native_obj=True,
    user_defined_macros={"project": "acme"},
    user_defined_filters={"shout": lambda text: text.upper() + "!"},
    template_searchpath=[Variable.get("sql_dir")],
    params={"day": Param("2026-03-10", type="string", format="date")},
):
    PythonOperator(
        task_id="render",
        python_callable=show,
        templates_exts=[".sql"],
        op_kwargs={
            "ids": "{{ dag_run.conf['ids'] }}",
            "limit": "{{ dag_run.conf['limit'] + 1 }}",
            "sql": "query.sql",
            "label": "{{ project | shout }} {{ params.day }}",
            "host": WAREHOUSE.host,
        },
    )

    @task
    def make_args():
        return [6, 7]

    @task
    def make_kwargs():
        return {"unit": "kg"}

    PythonOperator(
        task_id="whole",
        python_callable=lambda a, b, unit: f"{a * b}{unit} for {OWNER}",
        op_args=make_args(),
        op_kwargs=make_kwargs(),
    )
    for region in REGIONS:  # tasks decided by a variable at parse time
        PythonOperator(task_id=f"load_{region}", python_callable=lambda: "loaded")
"""

LEAKY = """
from engine import Variable

password = Variable.get("api_password")
raise ValueError(f"cannot log in with {password}")
"""

MISSING = """
from engine import Variable

Variable.get("not_defined_anywhere")
"""

WRITES = """
from engine import Variable

Variable.set("written_at_parse_time", "x")
"""


class World:
    def __init__(self, db: Database, cipher: KwargsCipher, processor: DagProcessor, config):
        self.db, self.cipher, self.processor, self.config = db, cipher, processor, config
        self.scheduler = Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())

    def trigger(self, conf: dict[str, Any]) -> int:
        now = datetime.now(UTC)
        triggered = self.db.call(
            lambda s: operations.trigger_dag(s, "ported", conf=conf, logical_date=None, now=now)
        )
        return int(
            self.db.call(
                lambda s: s.execute(
                    select(DagRun.id).where(DagRun.run_id == triggered["run_id"])
                ).scalar_one()
            )
        )

    async def run_to_end(self, run_pk: int) -> str:
        async def ended() -> str | None:
            await self.scheduler.schedule_once()
            run = await self.db.run(lambda s: s.get(DagRun, run_pk))
            return run.state if run.state in ("success", "failed") else None

        result: str = await eventually(ended, within=60, step=0.05)
        return result

    def result(self, run_pk: int, task_id: str) -> Any:
        ti = self.db.call(
            lambda s: s.execute(
                select(TaskInstance).where(
                    TaskInstance.dag_run_id == run_pk, TaskInstance.task_id == task_id
                )
            ).scalar_one()
        )
        return deserialize_value((ti.xcoms or {})["return_value"])


@pytest.fixture
async def world(migrated_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dags = tmp_path / "dags"
    dags.mkdir()
    sql_dir = tmp_path / "sql"
    sql_dir.mkdir()
    (sql_dir / "query.sql").write_text("select * from orders where day = '{{ params.day }}'")
    for name, source in (
        ("ported.py", PORTED),
        ("leaky.py", LEAKY),
        ("missing.py", MISSING),
        ("writes.py", WRITES),
    ):
        (dags / name).write_text(textwrap.dedent(source))
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("SLUICE__CORE__FERNET_KEY", key)  # must not reach the children
    db = Database(migrated_db_url)
    cipher = KwargsCipher(key)
    db.call(lambda s: store.set_variable(s, cipher, "regions", '["eu", "us"]'))
    db.call(lambda s: store.set_variable(s, cipher, "sql_dir", str(sql_dir)))
    db.call(lambda s: store.set_variable(s, cipher, "api_password", PASSWORD))
    fields = {"conn_type": "postgres", "host": "db.internal", "password": PASSWORD}
    db.call(lambda s: store.upsert_connection(s, cipher, "warehouse", fields))
    config = load_config(
        environ={
            "SLUICE_HOME": str(tmp_path / "home"),
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": db.url,
            "SLUICE__CORE__FERNET_KEY": key,
        }
    )
    settings = DagProcessorSettings.from_config(config)
    processor = DagProcessor(db=db, cipher=cipher, settings=settings)
    with anyio.fail_after(60):
        await processor.parse_once()
    yield World(db, cipher, processor, config)
    db.dispose()


def errors(world: World) -> dict[str, dags_sql.ParseErrorRow]:
    return {
        row.fileloc.rsplit("/", 1)[-1]: row for row in world.db.call(dags_sql.list_parse_errors)
    }


@pytest.mark.both_databases
async def test_a_ported_dag_file_parses_with_top_level_reads_and_runs(world: World) -> None:
    assert "ported.py" not in errors(world)
    tasks = world.db.call(dags_sql.load_dag_tasks)["ported"]
    ids = {row["task_id"] for row in tasks}
    assert {"render", "whole", "load_eu", "load_us"} <= ids
    run_pk = world.trigger({"ids": [1, 2, 3], "limit": 5, "day": "2026-03-11"})
    with anyio.fail_after(90):
        async with running_executor(world.db, world.cipher, fast_executor_settings(world.config)):
            assert await world.run_to_end(run_pk) == "success"
    assert world.result(run_pk, "render") == {
        "ids": [1, 2, 3],  # a list, not its text
        "limit": 6,
        "sql": "select * from orders where day = '2026-03-11'",
        "label": "ACME! 2026-03-11",
        "host": "db.internal",
    }
    assert world.result(run_pk, "whole") == "42kg for nobody"


async def test_parse_time_reads_fail_as_airflow_and_mask_secrets(world: World) -> None:
    found = errors(world)
    leaky = found["leaky.py"]
    assert PASSWORD not in leaky.error and PASSWORD not in (leaky.stacktrace or "")
    assert "ValueError: cannot log in with ***" in leaky.error
    assert "KeyError: 'Variable not_defined_anywhere does not exist'" in found["missing.py"].error
    writes = found["writes.py"].error
    assert "StoreUnavailableError: Variable.set('written_at_parse_time')" in writes
    assert "may only read" in writes


async def test_a_param_format_is_checked_when_a_run_is_triggered(world: World) -> None:
    with pytest.raises(OperatorActionError, match=r"param 'day': '2026-13-01' is not a 'date'"):
        world.trigger({"day": "2026-13-01"})
    result = run_cli(world.config, "dags", "trigger", "ported", "--conf", '{"day": "2026-02-30"}')
    assert result.exit_code != 0
    assert "param 'day': '2026-02-30' is not a 'date' (e.g. '2026-03-10')" in result.output
    runs = world.db.call(lambda s: s.execute(select(DagRun.id)).scalars().all())
    assert runs == []  # refused: no run created
    assert world.trigger({"day": "2026-12-31"}) > 0


PAUSING = """
from engine import DAG

follows = DAG("follows_config", schedule=None)
running = DAG("says_running", schedule=None, is_paused_upon_creation=False)
paused = DAG("says_paused", schedule=None, is_paused_upon_creation=True)
"""


@pytest.mark.parametrize("paused_at_creation", [True, False])
def test_dags_are_paused_at_creation(
    migrated_db_url: str, tmp_path: Path, paused_at_creation: bool
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "pausing.py").write_text(textwrap.dedent(PAUSING))
    config = load_config(
        environ={
            "SLUICE_HOME": str(tmp_path / "home"),
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(paused_at_creation).lower(),
        }
    )
    assert config.core.dags_are_paused_at_creation is paused_at_creation
    db = Database(migrated_db_url)
    try:
        cipher = KwargsCipher(Fernet.generate_key().decode())
        settings = DagProcessorSettings.from_config(config)
        processor = DagProcessor(db=db, cipher=cipher, settings=settings)
        anyio.run(processor.parse_once)
        rows = {dag_id: row.is_paused for dag_id, row in db.call(dags_sql.load_dags).items()}
    finally:
        db.dispose()
    assert rows == {
        "follows_config": paused_at_creation,
        "says_running": False,
        "says_paused": True,
    }
