"""The DAG processor on a real dags folder, child processes and SQLite / PostgreSQL."""

from __future__ import annotations

import logging
import os
import textwrap
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine import Asset
from engine.crypto import KwargsCipher
from engine.dag_processing import processor as processor_module
from engine.dag_processing.processor import TIMEOUT_ERROR, DagProcessor, DagProcessorSettings
from engine.db.database import Database
from engine.db.models import Base, DagParseError
from engine.db.queries import dags as dags_sql
from engine.states import TriggerKind
from tests.db_reads import count_triggers
from tests.waiting import wait_until

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.integration

GOOD = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import FileDeleteTrigger

orders = Asset(
    "orders",
    watchers=[AssetWatcher("orders_flag", FileDeleteTrigger("@ORDERS@", poke_interval=1.0))],
)
customers = Asset(
    "customers",
    uri="s3://bucket/customers",
    watchers=[AssetWatcher("customers_flag", FileDeleteTrigger("/flags/customers.flag"))],
)

with DAG("orders_etl", schedule=orders & customers, description="orders"):
    @task
    def extract(triggering_asset_events):
        return triggering_asset_events

    @task
    def load():
        return None

    extract() >> load()
"""
ASSETS_ONLY = """
from engine import Asset, AssetWatcher
from triggers import FileDeleteTrigger

orders = Asset(
    "orders",
    watchers=[AssetWatcher("orders_flag", FileDeleteTrigger("@ORDERS@", poke_interval=1.0))],
)
"""
BASE_TRIGGER = """
from engine import DAG, Asset, AssetWatcher
from triggers import FileTrigger

landing = Asset("landing", watchers=[AssetWatcher("landing_file", FileTrigger("/in/*.csv"))])
dag = DAG("landing_dag", schedule=landing)
"""
HANGING = """
import time
counter = 0
while True:
    counter += 1
"""
SNAPSHOT_TABLES = (
    "dag",
    "dag_task",
    "asset",
    "asset_watcher",
    "trigger",
    "dag_schedule_asset",
    "dag_file",
    "dag_parse_error",
)
VOLATILE_COLUMNS = {"last_parsed_time", "timestamp", "updated_at"}


@pytest.fixture
def database(migrated_db_url: str):
    db = Database(migrated_db_url)
    yield db
    db.dispose()


@pytest.fixture
def cipher() -> KwargsCipher:
    return KwargsCipher(Fernet.generate_key().decode())


@pytest.fixture
def dags_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "dags"
    folder.mkdir()
    return folder


@pytest.fixture
def processor(database: Database, cipher: KwargsCipher, dags_folder: Path) -> DagProcessor:
    settings = DagProcessorSettings(
        dags_folder=dags_folder,
        plugins_folder=dags_folder.parent / "plugins",
        file_timeout_s=5.0,  # several files parse at once on 2 cores: room for slow starts
        refresh_interval_s=60.0,
    )
    return DagProcessor(db=database, cipher=cipher, settings=settings)


def write(folder: Path, name: str, source: str, orders_flag: str = "/flags/orders.flag") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).replace("@ORDERS@", orders_flag))
    return path


def snapshot(db: Database) -> dict[str, list[dict[str, Any]]]:
    def read(session):
        tables = {}
        for name in SNAPSHOT_TABLES:
            table = Base.metadata.tables[name]
            rows = session.execute(select(table).order_by(*table.primary_key.columns))
            tables[name] = [
                {k: v for k, v in row.items() if k not in VOLATILE_COLUMNS}
                for row in rows.mappings()
            ]
        return tables

    return db.call(read)


def watchers_by_name(db: Database) -> dict[str, dags_sql.WatcherRowState]:
    return {row.name: row for row in db.call(dags_sql.load_asset_watchers)}


def errors_by_file(db: Database) -> dict[str, dags_sql.ParseErrorRow]:
    return {row.fileloc: row for row in db.call(dags_sql.list_parse_errors)}


@pytest.mark.both_databases
async def test_parse_stores_dags_assets_watchers_and_errors(
    processor: DagProcessor, database: Database, cipher: KwargsCipher, dags_folder: Path
) -> None:
    with anyio.fail_after(20):
        good = write(dags_folder, "good.py", GOOD, orders_flag="/secret/orders-4711.flag")
        syntax = write(dags_folder, "syntax.py", "from engine import DAG\nDAG('s',\n")
        missing = write(dags_folder, "missing.py", "import os\n\nimport no_such_module_here\n")
        base_trigger = write(dags_folder, "base_trigger.py", BASE_TRIGGER)
        hanging = write(dags_folder, "hanging.py", HANGING)
        report = await processor.parse_once()

    assert report is not None
    assert set(report.errors) == {str(p) for p in (syntax, missing, base_trigger, hanging)}
    (dag,) = database.call(dags_sql.load_dags).values()
    assert (dag.dag_id, dag.fileloc, dag.is_active) == ("orders_etl", str(good), True)
    assert dag.schedule == (Asset("orders") & Asset("customers", "s3://bucket/customers")).to_json()
    tasks = database.call(dags_sql.load_dag_tasks)["orders_etl"]
    assert [(t["task_id"], t["downstream_task_ids"]) for t in tasks] == [
        ("extract", ["load"]),
        ("load", []),
    ]
    assets = database.call(dags_sql.load_assets)
    assert {name: row.uri for name, row in assets.items()} == {
        "orders": "orders",
        "customers": "s3://bucket/customers",
    }
    edges = database.call(dags_sql.load_schedule_edges)
    assert edges == {("orders_etl", assets["orders"].id), ("orders_etl", assets["customers"].id)}
    scheduled = database.call(lambda s: dags_sql.dags_scheduled_on(s, [assets["orders"].id]))
    assert scheduled == {"orders_etl": dag.schedule}

    watchers = watchers_by_name(database)
    assert set(watchers) == {"orders_flag", "customers_flag"}
    orders_flag = watchers["orders_flag"]
    assert orders_flag.classpath == "triggers.file.FileDeleteTrigger"
    assert cipher.decrypt_kwargs(orders_flag.kwargs) == {
        "filepath": "/secret/orders-4711.flag",
        "poke_interval": 1.0,
    }
    kinds = database.call(lambda s: s.execute(select(Base.metadata.tables["trigger"].c.kind)))
    assert {row.kind for row in kinds} == {TriggerKind.WATCHER}
    stored = snapshot(database)
    assert "orders-4711" not in repr(stored["trigger"]) + repr(stored["dag_file"])

    errors = errors_by_file(database)
    assert errors[str(syntax)].lineno == 2 and errors[str(syntax)].error.startswith("SyntaxError")
    assert errors[str(missing)].lineno == 3
    assert "no_such_module_here" in errors[str(missing)].error
    bad = errors[str(base_trigger)]
    assert bad.lineno == 5
    assert str(base_trigger) in bad.error and "'landing'" in bad.error
    assert "'landing_file'" in bad.error and "BaseEventTrigger" in bad.error
    hung = errors[str(hanging)]
    assert hung.error.startswith(TIMEOUT_ERROR) and hung.lineno in (4, 5)


async def test_reparsing_unchanged_files_changes_nothing(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    write(dags_folder, "good.py", GOOD)
    write(dags_folder, "unscheduled.py", ASSETS_ONLY.replace('"orders"', '"spare"'))
    with anyio.fail_after(15):
        await processor.parse_once()
        before = snapshot(database)
        report = await processor.parse_once()
    assert report is not None
    assert (report.triggers_created, report.triggers_deleted, report.dags_added) == (0, 0, [])
    assert snapshot(database) == before
    assert len(before["trigger"]) == 2  # the unscheduled asset's watcher does not run


async def test_a_pass_that_changes_nothing_is_logged_at_debug(
    processor: DagProcessor, dags_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The periodic re-parse of an untouched folder says nothing new: its summary is at
    DEBUG; a pass that finds a file, a DAG or a watcher changed is at INFO."""
    caplog.set_level(logging.DEBUG, logger="engine.dag_processing.processor")
    good = write(dags_folder, "good.py", GOOD)
    levels = []

    async def one_pass() -> None:
        caplog.clear()
        await processor.parse_once()
        [summary] = [r for r in caplog.records if r.action == "dag_processing_pass"]
        levels.append((logging.getLevelName(summary.levelno), summary.changed))

    with anyio.fail_after(20):
        await one_pass()  # the first pass: everything is new
        await one_pass()  # nothing changed
        good.write_text(good.read_text() + "\n# edited\n")
        await one_pass()  # the file's source changed (its DAGs are the same)
        write(dags_folder, "plain.py", "x = 1\n")
        await one_pass()  # a new file, with no DAG
        await one_pass()
    assert levels == [
        ("INFO", True),
        ("DEBUG", False),
        ("INFO", True),
        ("INFO", True),
        ("DEBUG", False),
    ]


@pytest.mark.both_databases
async def test_changed_watcher_kwargs_replace_only_that_trigger(
    processor: DagProcessor, database: Database, cipher: KwargsCipher, dags_folder: Path
) -> None:
    write(dags_folder, "good.py", GOOD)
    with anyio.fail_after(15):
        await processor.parse_once()
        before = watchers_by_name(database)
        write(dags_folder, "good.py", GOOD, orders_flag="/flags/orders-v2.flag")
        report = await processor.parse_once()
    after = watchers_by_name(database)
    assert report is not None and (report.triggers_created, report.triggers_deleted) == (1, 1)
    assert after["customers_flag"].trigger_id == before["customers_flag"].trigger_id
    assert after["orders_flag"].trigger_id != before["orders_flag"].trigger_id
    assert after["orders_flag"].id == before["orders_flag"].id
    assert cipher.decrypt_kwargs(after["orders_flag"].kwargs)["filepath"] == "/flags/orders-v2.flag"
    trigger_ids = {row.trigger_id for row in after.values()}
    assert database.call(count_triggers) == 2
    assert before["orders_flag"].trigger_id not in trigger_ids


@pytest.mark.both_databases
async def test_removed_dag_is_retired_and_its_watchers_deleted(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    good = write(dags_folder, "good.py", GOOD)
    with anyio.fail_after(15):
        await processor.parse_once()
        write(dags_folder, "good.py", ASSETS_ONLY)  # the DAG is gone, the asset stays
        report = await processor.parse_once()
        assert report is not None and report.dags_deactivated == ["orders_etl"]
        assert not database.call(dags_sql.load_dags)["orders_etl"].is_active
        assert database.call(dags_sql.load_schedule_edges) == set()
        assert database.call(dags_sql.load_asset_watchers) == []
        assert database.call(count_triggers) == 0
        assets = database.call(dags_sql.load_assets)
        assert assets["orders"].is_active and not assets["customers"].is_active

        good.unlink()
        await processor.parse_once()
    assert not database.call(dags_sql.load_assets)["orders"].is_active
    assert database.call(dags_sql.load_dag_files) == {}


async def test_asset_watchers_run_only_while_an_active_dag_schedules_on_it(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    write(dags_folder, "assets.py", ASSETS_ONLY)
    with anyio.fail_after(15):
        await processor.parse_once()
        assert database.call(count_triggers) == 0
        consumer = (
            "from engine import DAG, Asset\ndag = DAG('consumer', schedule=Asset('orders'))\n"
        )
        path = write(dags_folder, "consumer.py", consumer)
        await processor.parse_once()
        assert set(watchers_by_name(database)) == {"orders_flag"}
        path.unlink()
        await processor.parse_once()
    assert database.call(count_triggers) == 0
    assert not database.call(dags_sql.load_dags)["consumer"].is_active


async def test_dag_files_share_assets_from_the_plugins_folder(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    plugins = dags_folder.parent / "plugins"
    plugins.mkdir()
    write(plugins, "shared_assets.py", ASSETS_ONLY)
    consumer = (
        "from engine import DAG\nfrom shared_assets import orders\nd = DAG('{}', schedule=orders)\n"
    )
    write(dags_folder, "first.py", consumer.format("first"))
    write(dags_folder, "second.py", consumer.format("second"))
    with anyio.fail_after(15):
        report = await processor.parse_once()
    assert report is not None and report.errors == {}
    assert report.dags_active == 2
    assert set(watchers_by_name(database)) == {"orders_flag"}
    assert database.call(count_triggers) == 1


async def test_a_file_that_now_fails_keeps_its_last_good_version(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    good = write(dags_folder, "good.py", GOOD)
    with anyio.fail_after(15):
        await processor.parse_once()
        before = snapshot(database)
        good.write_text(good.read_text() + "\nraise RuntimeError('half-edited')\n")
        report = await processor.parse_once()
        assert report is not None and set(report.errors) == {str(good)}
        error = errors_by_file(database)[str(good)]
        assert "RuntimeError: half-edited" in error.error and error.lineno is not None
        after = snapshot(database)
        assert {k: v for k, v in after.items() if k != "dag_parse_error"} == {
            k: v for k, v in before.items() if k != "dag_parse_error"
        }
        write(dags_folder, "good.py", GOOD)
        await processor.parse_once()
    assert errors_by_file(database) == {}
    assert snapshot(database) == before


async def test_duplicate_dag_id_across_files_is_an_error_on_the_newcomer(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    good = write(dags_folder, "good.py", GOOD)
    with anyio.fail_after(15):
        await processor.parse_once()
        extra = "\nfrom engine import DAG\nextra = DAG('extra_dag')\n"
        copy = write(dags_folder, "a_copy.py", GOOD + extra)
        report = await processor.parse_once()
    assert report is not None and set(report.errors) == {str(copy)}
    error = errors_by_file(database)[str(copy)]
    assert error.error.startswith("DuplicateDagIdError")
    assert str(good) in error.error and str(copy) in error.error
    assert error.lineno is not None
    dags = database.call(dags_sql.load_dags)
    assert set(dags) == {"orders_etl"} and dags["orders_etl"].fileloc == str(good)


async def test_a_refused_file_is_retried_when_the_clash_goes_away(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    """``run`` parses a changed file alone, with the files refused for a clash: once the
    clash is gone (the DAG moved out of the other file), the refused file is accepted."""
    good = write(dags_folder, "good.py", GOOD)
    write(dags_folder, "other.py", "from engine import DAG\ndag = DAG('other_dag')\n")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(processor.run)
            copy = write(dags_folder, "a_copy.py", GOOD)
            await _until_a_pass(processor, lambda: set(errors_by_file(database)) == {str(copy)})
            write(dags_folder, good.name, ASSETS_ONLY)  # the DAG moves to a_copy.py
            await _until_a_pass(processor, lambda: not errors_by_file(database))
            report = processor.last_report
            tg.cancel_scope.cancel()
    # That pass parsed good.py and the refused a_copy.py, not other.py.
    assert report is not None and report.errors == {} and report.files_parsed == 2
    assert database.call(dags_sql.load_dags)["orders_etl"].fileloc == str(copy)
    assert errors_by_file(database) == {}


async def _until_a_pass(processor: DagProcessor, condition: Callable[[], bool]) -> None:
    """Wait for the passes of a running processor until ``condition`` holds after one."""
    while True:
        seen = processor.passes
        await processor.wait_for_pass(after=seen)
        if condition():
            return


async def test_file_errors_are_logged_once_until_they_change(
    processor: DagProcessor, dags_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = write(dags_folder, "broken.py", "import no_such_module_here\n")
    caplog.set_level(logging.INFO, logger="engine.dag_processing.processor")
    with anyio.fail_after(15):
        await processor.parse_once()
        await processor.parse_once()
        write(dags_folder, "broken.py", "x = 1\n")
        await processor.parse_once()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("dag_file_error") == 1
    assert actions.count("dag_file_fixed") == 1
    (error,) = [r for r in caplog.records if getattr(r, "action", None) == "dag_file_error"]
    assert error.fileloc == str(broken) and error.line == 1


async def test_missing_dags_folder_leaves_everything_as_it_is(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    write(dags_folder, "good.py", GOOD)
    with anyio.fail_after(15):
        await processor.parse_once()
        before = snapshot(database)
        await anyio.Path(dags_folder).rename(dags_folder.with_name("elsewhere"))
        assert await processor.parse_once() is None
    assert snapshot(database) == before


async def test_run_follows_changes_in_the_dags_folder(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    def is_active(dag_id: str) -> bool:
        row = database.call(dags_sql.load_dags).get(dag_id)
        return bool(row and row.is_active)

    async def wait_until(condition) -> None:
        while True:
            seen = processor.passes
            if condition():
                return
            await processor.wait_for_pass(after=seen)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(processor.run)
            assert processor.passes == 1
            new = write(dags_folder, "new.py", "from engine import DAG\ndag = DAG('late_dag')\n")
            await wait_until(lambda: is_active("late_dag"))
            new.unlink()
            await wait_until(lambda: not is_active("late_dag"))
            tg.cancel_scope.cancel()


# --- parsing children forked from the parse runner ------------------------------------------

SECRET_PROBE = """
import os
raise ValueError("secret: " + os.environ.get("SLUICE__PROBE__TOKEN", "absent"))
"""


async def test_forked_children_parse_like_cold_ones_and_a_hanging_file_is_killed(
    database: Database,
    cipher: KwargsCipher,
    dags_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLUICE__PROBE__TOKEN", "hunter2-4711")
    settings = DagProcessorSettings(
        dags_folder=dags_folder,
        plugins_folder=dags_folder.parent / "plugins",
        file_timeout_s=5.0,
        secrets=("hunter2-4711",),  # kept out of the children's environment
    )
    processor = DagProcessor(db=database, cipher=cipher, settings=settings)
    write(dags_folder, "good.py", GOOD)
    missing = write(dags_folder, "missing.py", "import os\n\nimport no_such_module_here\n")
    hanging = write(dags_folder, "hanging.py", HANGING)
    probe = write(dags_folder, "probe.py", SECRET_PROBE)
    with anyio.fail_after(30):
        async with processor.forking() as runner:
            report = await processor.parse_once()
    assert report is not None
    assert (runner.forks, runner.fallbacks) == (4, 0)  # every file in a fork, none cold
    assert set(database.call(dags_sql.load_dags)) == {"orders_etl"}
    errors = errors_by_file(database)
    assert set(errors) == {str(missing), str(hanging), str(probe)}
    assert errors[str(missing)].lineno == 3
    hung = errors[str(hanging)]
    assert hung.error.startswith(TIMEOUT_ERROR) and hung.lineno in (4, 5)
    assert "secret: absent" in errors[str(probe)].error


async def test_the_parse_runner_keeps_a_standby_ready_for_each_parsing_process(
    database: Database, cipher: KwargsCipher, dags_folder: Path
) -> None:
    """Two files parse at a time, each in a standby of its own forked ahead: the standbys
    are made side by side, not one after the other; each used one is reaped."""
    settings = DagProcessorSettings(
        dags_folder=dags_folder, file_timeout_s=10.0, parsing_processes=2
    )
    processor = DagProcessor(db=database, cipher=cipher, settings=settings)
    for n in range(6):
        write(dags_folder, f"d{n}.py", f"from engine import DAG\ndag = DAG('d{n}')\n")
    with anyio.fail_after(60):
        async with processor.forking() as runner:
            await wait_until(lambda: len(runner._standbys) == 2, within=30)
            ready = [standby.pid for standby in runner._standbys]
            report = await processor.parse_once()
            assert (runner.forks, runner.fallbacks) == (6, 0)
    assert report is not None and report.dags_active == 6
    for pid in ready:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - parsed a file, and was reaped


async def test_a_pass_stamps_the_parse_time_of_every_dag_it_parsed_and_changes_the_changed(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    """Re-parsed DAGs that changed nothing get their parse time in one statement; a changed
    one gets its new columns and its parse time; a DAG of a file not parsed keeps its time."""
    for n in range(3):
        write(dags_folder, f"d{n}.py", f"from engine import DAG\ndag = DAG('d{n}')\n")

    def stamps() -> dict[str, tuple[Any, Any]]:
        def read(session: Any) -> dict[str, tuple[Any, Any]]:
            rows = session.execute(
                select(Base.metadata.tables["dag"].c[("dag_id", "last_parsed_time", "description")])
            )
            return {row[0]: (row[1], row[2]) for row in rows}

        return database.call(read)

    with anyio.fail_after(60):
        await processor.parse_once()
        first = stamps()
        write(dags_folder, "d1.py", "from engine import DAG\ndag = DAG('d1', description='new')\n")
        await processor.parse_once()
        second = stamps()
        await processor._parse({dags_folder / "d2.py"})
        third = stamps()
    assert all(second[d][0] > first[d][0] for d in first)
    assert [second[d][1] for d in ("d0", "d1", "d2")] == [None, "new", None]
    assert third["d2"][0] > second["d2"][0]
    assert (third["d0"], third["d1"]) == (second["d0"], second["d1"])


HELPER = "LABEL = {label!r}\n"
USES = """
from engine import DAG
import {module}

dag = DAG("{dag_id}", description={module}.LABEL)
"""


async def test_a_changed_module_reparses_the_files_that_import_it_and_no_other(
    processor: DagProcessor, database: Database, dags_folder: Path
) -> None:
    plugins = dags_folder.parent / "plugins"
    plugins.mkdir()
    helper = write(dags_folder, "helper.py", HELPER.format(label="h1"))
    shared = write(plugins, "shared_mod.py", HELPER.format(label="s1"))
    uses_helper = write(dags_folder, "uses_helper.py", USES.format(module="helper", dag_id="a"))
    uses_shared = write(dags_folder, "uses_shared.py", USES.format(module="shared_mod", dag_id="b"))
    alone = write(dags_folder, "alone.py", "from engine import DAG\ndag = DAG('alone')\n")

    def description(dag_id: str) -> str | None:
        return database.call(dags_sql.load_dags)[dag_id].description

    def parses() -> dict[str, int]:
        return {
            path.name: processor.parses[str(path)] for path in (uses_helper, uses_shared, alone)
        }

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(processor.run)
            assert parses() == {"uses_helper.py": 1, "uses_shared.py": 1, "alone.py": 1}
            assert (description("a"), description("b")) == ("h1", "s1")
            # A new length as well as new text: Python's bytecode cache checks a source's
            # mtime in whole seconds and its size, so a same-size edit within the second of
            # the first import would be read from the stale .pyc (as in any Python program).
            write(dags_folder, "helper.py", HELPER.format(label="h2-new"))
            await _until_a_pass(processor, lambda: description("a") == "h2-new")
            assert parses() == {"uses_helper.py": 2, "uses_shared.py": 1, "alone.py": 1}
            assert processor.parses[str(helper)] == 2  # itself a file of the dags folder
            write(plugins, "shared_mod.py", HELPER.format(label="s2-new"))
            await _until_a_pass(processor, lambda: description("b") == "s2-new")
            assert parses() == {"uses_helper.py": 2, "uses_shared.py": 2, "alone.py": 1}
            assert str(shared) not in processor.parses  # the plugins folder is not parsed
            forks = processor.parse_runner.forks if processor.parse_runner else 0
            tg.cancel_scope.cancel()
    assert forks >= 3  # the first full pass may start cold while the runner gets ready


async def test_the_listing_finds_what_the_watch_missed_and_the_refresh_parses_all(
    database: Database, cipher: KwargsCipher, dags_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def blind_watch(*folders, **kwargs):  # a filesystem whose changes nobody reports
        await anyio.sleep_forever()
        yield set()

    monkeypatch.setattr(processor_module.watchfiles, "awatch", blind_watch)
    changed = write(
        dags_folder, "changed.py", "from engine import DAG\ndag = DAG('c', description='1')\n"
    )
    same = write(dags_folder, "same.py", "from engine import DAG\ndag = DAG('s')\n")
    settings = DagProcessorSettings(
        dags_folder=dags_folder, list_interval_s=0.2, refresh_interval_s=3600, parse_runner=False
    )
    processor = DagProcessor(db=database, cipher=cipher, settings=settings)

    def description() -> str | None:
        return database.call(dags_sql.load_dags)["c"].description

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(processor.run)
            write(
                dags_folder,
                "changed.py",
                "from engine import DAG\ndag = DAG('c', description='22')\n",
            )
            await _until_a_pass(processor, lambda: description() == "22")
            assert (processor.parses[str(changed)], processor.parses[str(same)]) == (2, 1)
            tg.cancel_scope.cancel()

    refreshing = DagProcessor(
        db=database, cipher=cipher, settings=replace(settings, refresh_interval_s=0.1)
    )
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(refreshing.run)
            await _until_a_pass(refreshing, lambda: refreshing.parses[str(same)] >= 2)
            tg.cancel_scope.cancel()
    assert refreshing.parses[str(changed)] >= 2  # every file, changed or not


async def test_a_file_whose_parse_timed_out_is_parsed_aside_and_holds_no_other_change(
    database: Database, cipher: KwargsCipher, dags_folder: Path
) -> None:
    """A file that hangs is parsed again (at every refresh here), but beside the passes: a
    change to another file is applied by a sync that did not wait for the hanging one, and a
    processor started later is ready without waiting for it.

    Every sync stamps what it parsed with its own clock reading: a DAG's parse time equal to
    the hanging file's error time would mean one sync applied both (the hanging file's
    timeout then held the change back), as every pass did before."""
    good = write(dags_folder, "good.py", "from engine import DAG\ndag = DAG('g')\n")
    # hangs asleep (HANGING spins): re-parsed back to back here, it would hold a core
    hanging = write(dags_folder, "hanging.py", "import time\n\ntime.sleep(3600)\n")
    settings = DagProcessorSettings(
        dags_folder=dags_folder, file_timeout_s=4.0, refresh_interval_s=0.2
    )
    processor = DagProcessor(db=database, cipher=cipher, settings=settings)
    tables = Base.metadata.tables

    def stamps() -> tuple[Any, Any, Any]:
        def read(session: Any) -> tuple[Any, Any, Any]:
            dag = tables["dag"]
            parsed = session.execute(
                select(dag.c.last_parsed_time, dag.c.description).where(dag.c.dag_id == "g")
            ).one()
            errors = tables[DagParseError.__tablename__]
            failed = session.execute(
                select(errors.c.timestamp).where(errors.c.fileloc == str(hanging))
            ).scalar_one()
            return parsed[0], parsed[1], failed

        return database.call(read)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(processor.run)  # the first pass waits for the timeout, once
            first_parsed, _, first_failed = stamps()
            assert first_parsed == first_failed  # that pass applied both files
            write(
                dags_folder, "good.py", "from engine import DAG\ndag = DAG('g', description='2')\n"
            )
            await _until_a_pass(processor, lambda: stamps()[1] == "2")
            parsed, _, failed = stamps()
            await _until_a_pass(processor, lambda: processor.parses[str(hanging)] >= 2)
            tg.cancel_scope.cancel()
    assert parsed != failed  # the change's sync did not parse the hanging file
    assert processor.parses[str(good)] >= 2
    errors = errors_by_file(database)
    assert set(errors) == {str(hanging)} and errors[str(hanging)].error.startswith(TIMEOUT_ERROR)

    # A new processor (an engine restarted) reads the timeout from the database: its first
    # pass, which its readiness waits for, leaves the hanging file aside too.
    restarted = DagProcessor(db=database, cipher=cipher, settings=settings)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(restarted.run)
            parsed, _, failed = stamps()
            tg.cancel_scope.cancel()
    assert parsed != failed
