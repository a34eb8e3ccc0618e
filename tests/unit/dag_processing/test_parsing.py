"""Describing a DAG file as plain data (in-process), and the pure accept/plan of the sync."""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import asdict
from typing import TYPE_CHECKING

import pytest

from engine.authoring.dag_files import DAG_MODULE_PREFIX
from engine.config import load_config
from engine.dag_processing.parsing import (
    FileParseResult,
    ParsedAsset,
    ParsedDag,
    ParsedTask,
    ParsedWatcher,
    ParseError,
    parse_file,
)
from engine.dag_processing.planning import (
    ASSET_CONFLICT,
    DUPLICATE_DAG_ID,
    accept_results,
    find_conflict,
    plan,
    task_rows,
)
from engine.dag_processing.processor import DagProcessorSettings, list_dag_files
from engine.execution.loading import load_task

if TYPE_CHECKING:
    from pathlib import Path

GOOD = """
from datetime import timedelta
from engine import DAG, Asset, AssetWatcher, task
from triggers import FileDeleteTrigger

orders = Asset("orders", watchers=[AssetWatcher("flag", FileDeleteTrigger("/tmp/o.flag"))])
spare = Asset("spare", uri="s3://spare")

with DAG("etl", schedule=orders & Asset("customers"), description="demo"):
    @task(execution_timeout=timedelta(seconds=1.5))
    def extract():
        return 1

    @task
    def load():
        return 2

    extract() >> load()
"""


@pytest.fixture(autouse=True)
def _forget_dag_modules():
    yield
    for name in [n for n in sys.modules if n.startswith(DAG_MODULE_PREFIX)]:
        del sys.modules[name]


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def test_parse_file_describes_dags_and_assets(tmp_path: Path) -> None:
    path = write(tmp_path, "good.py", GOOD)
    result = parse_file(path)
    assert result.ok, result.error
    (dag,) = result.dags
    assert (dag.dag_id, dag.description, dag.lineno) == ("etl", "demo", 9)
    assert dag.schedule_assets == ("orders", "customers")
    assert [(t.task_id, t.downstream) for t in dag.tasks] == [("extract", ("load",)), ("load", ())]
    assert dag.tasks[0].execution_timeout_s == 1.5
    assert dag.tasks[0].operator == "engine.authoring.operators.PythonOperator"
    assets = {asset.name: asset for asset in result.assets}
    assert set(assets) == {"orders", "customers", "spare"}
    (watcher,) = assets["orders"].watchers
    assert watcher.classpath == "triggers.file.FileDeleteTrigger"
    assert '"filepath":"/tmp/o.flag"' in watcher.kwargs
    assert assets["spare"].uri == "s3://spare"
    assert FileParseResult.from_json(result.to_json()) == result


def test_load_task_returns_a_fresh_operator(tmp_path: Path) -> None:
    path = write(tmp_path, "good.py", GOOD)
    first = load_task(path, "etl", "extract")
    second = load_task(path, "etl", "extract")
    assert first is not second
    assert first.execute({}) == 1


def test_base_trigger_watcher_is_a_parse_error_naming_file_asset_watcher(tmp_path: Path) -> None:
    source = """
    from engine import DAG, Asset, AssetWatcher
    from triggers import FileTrigger

    bad = Asset("orders", watchers=[AssetWatcher("landing", FileTrigger("/tmp/x"))])
    """
    path = write(tmp_path, "bad_watcher.py", source)
    error = parse_file(path).error
    assert error is not None
    assert error.type == "DagDefinitionError"
    assert error.lineno == 5
    assert str(path) in error.message
    assert "'orders'" in error.message and "'landing'" in error.message


@pytest.mark.parametrize(
    ("source", "error_type", "lineno", "match"),
    [
        ("x = (\n", "SyntaxError", 1, "never closed"),
        ("import os\nimport not_a_module_anywhere\n", "ModuleNotFoundError", 2, "not_a_module"),
        ("import sys\nsys.exit(3)\n", "SystemExit", 2, "3"),
        (
            "from engine import DAG\nDAG('same', auto_register=False)\n"
            "a = DAG('same', auto_register=False)\nb = DAG('same', auto_register=False)\n",
            "DagDefinitionError",
            4,
            "two DAGs have the dag_id 'same'",
        ),
        (
            "from engine import Asset\na = Asset('x')\nb = Asset('x', uri='y')\n",
            "DagDefinitionError",
            None,
            "two uris",
        ),
    ],
)
def test_import_failures_become_errors_with_lines(
    tmp_path: Path, source: str, error_type: str, lineno: int | None, match: str
) -> None:
    path = write(tmp_path, "broken.py", source)
    error = parse_file(path).error
    assert error is not None
    assert (error.type, error.lineno) == (error_type, lineno)
    assert match in error.message
    assert error.describe(str(path)).startswith(f"{path}")


def test_trigger_class_defined_in_the_dag_file_is_refused(tmp_path: Path) -> None:
    source = """
    from engine import Asset, AssetWatcher
    from triggers import BaseEventTrigger

    class Local(BaseEventTrigger):
        def serialize(self):
            return (f"{type(self).__module__}.Local", {})
        async def run(self):
            yield

    a = Asset("a", watchers=[AssetWatcher("w", Local())])
    """
    error = parse_file(write(tmp_path, "local.py", source)).error
    assert error is not None and "plugins folder" in error.message


# --- pure sync decisions -------------------------------------------------------------------


def result(fileloc: str, dags: tuple[str, ...] = (), assets: tuple[ParsedAsset, ...] = ()):
    parsed = tuple(ParsedDag(dag_id=d, lineno=3, schedule_assets=("a",)) for d in dags)
    return FileParseResult(fileloc=fileloc, dags=parsed, assets=assets)


def asset(name: str = "a", uri: str = "a", kwargs: str = '{"x":1}') -> ParsedAsset:
    return ParsedAsset(name, uri, {}, (ParsedWatcher("w", "triggers.T", kwargs),))


def test_duplicate_dag_id_new_file_loses_to_the_file_in_use() -> None:
    old = {"/d/z.py": result("/d/z.py", ("x",))}
    fresh = {"/d/a.py": result("/d/a.py", ("x", "y"))}
    acceptance = accept_results(old, fresh, {"x": "/d/z.py"})
    assert acceptance.files == old and acceptance.accepted == set()
    error = acceptance.rejected["/d/a.py"]
    assert error.type == DUPLICATE_DAG_ID and error.lineno == 3
    assert "/d/a.py" in error.message and "/d/z.py" in error.message


def test_duplicate_dag_id_both_fresh_the_owner_keeps_it() -> None:
    fresh = {"/d/a.py": result("/d/a.py", ("x",)), "/d/z.py": result("/d/z.py", ("x",))}
    assert set(accept_results({}, fresh, {"x": "/d/z.py"}).rejected) == {"/d/a.py"}
    assert set(accept_results({}, fresh, {}).rejected) == {"/d/z.py"}  # sorted order


def test_rejected_file_keeps_its_previous_version() -> None:
    old = {"/d/a.py": result("/d/a.py", ("mine",)), "/d/z.py": result("/d/z.py", ("x",))}
    fresh = {"/d/a.py": result("/d/a.py", ("mine", "x"))}
    acceptance = accept_results(old, fresh, {"x": "/d/z.py", "mine": "/d/a.py"})
    assert acceptance.files["/d/a.py"] is old["/d/a.py"]


def test_moving_a_dag_between_files_in_one_pass_is_accepted() -> None:
    old = {"/d/a.py": result("/d/a.py", ("x",)), "/d/b.py": result("/d/b.py")}
    fresh = {"/d/a.py": result("/d/a.py"), "/d/b.py": result("/d/b.py", ("x",))}
    acceptance = accept_results(old, fresh, {"x": "/d/a.py"})
    assert acceptance.rejected == {} and acceptance.accepted == {"/d/a.py", "/d/b.py"}


def test_asset_conflicts_and_consistent_shared_changes() -> None:
    old = {"/d/a.py": result("/d/a.py", assets=(asset(),))}
    clash = {"/d/b.py": result("/d/b.py", assets=(asset(uri="other"),))}
    assert accept_results(old, clash, {}).rejected["/d/b.py"].type == ASSET_CONFLICT
    other_trigger = {"/d/b.py": result("/d/b.py", assets=(asset(kwargs='{"x":2}'),))}
    assert (
        "different triggers" in accept_results(old, other_trigger, {}).rejected["/d/b.py"].message
    )
    both = {
        "/d/a.py": result("/d/a.py", assets=(asset(kwargs='{"x":2}'),)),
        "/d/b.py": result("/d/b.py", assets=(asset(kwargs='{"x":2}'),)),
    }
    assert find_conflict(both) is None
    assert accept_results(old, both, {}).accepted == set(both)


def test_failed_fresh_results_keep_the_last_good() -> None:
    old = {"/d/a.py": result("/d/a.py", ("x",))}
    failed = FileParseResult("/d/a.py", error=ParseError("SyntaxError", "bad", 1))
    acceptance = accept_results(old, {"/d/a.py": failed}, {})
    assert acceptance.files == old and acceptance.accepted == set()


def test_plan_runs_watchers_only_for_scheduled_assets() -> None:
    unscheduled = ParsedAsset("b", "b", {}, (ParsedWatcher("w", "triggers.T", "{}"),))
    files = {"/d/a.py": result("/d/a.py", ("x",), assets=(asset(), unscheduled))}
    state = plan(files)
    assert set(state.assets) == {"a", "b"}
    assert state.edges == {("x", "a")}
    assert set(state.watchers) == {("a", "w")}
    assert plan({"/d/a.py": result("/d/a.py", assets=(asset(),))}).watchers == {}


def test_task_rows_keep_order_and_round_timeouts_up() -> None:
    tasks = (
        ParsedTask("b", "m.Op", ("a",), retries=1, execution_timeout_s=1.2),
        ParsedTask("a", "m.Op", start_from_trigger=True),
    )
    rows = task_rows(ParsedDag("d", tasks=tasks))
    assert [(r["task_id"], r["position"], r["execution_timeout_s"]) for r in rows] == [
        ("b", 0, 2),
        ("a", 1, None),
    ]
    assert rows[0]["downstream_task_ids"] == ["a"] and rows[1]["start_from_trigger"] is True


def test_processor_settings_from_config(tmp_path: Path) -> None:
    config = load_config(
        environ={
            "SLUICE__CORE__DAGS_FOLDER": str(tmp_path / "d"),
            "SLUICE__CORE__DAG_FILE_PROCESSOR_TIMEOUT": "7",
            "SLUICE__SCHEDULER__DAG_DIR_LIST_INTERVAL": "11",
            "SLUICE__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "600",
        },
        home=tmp_path,
    )
    settings = DagProcessorSettings.from_config(config)
    assert settings.dags_folder == tmp_path / "d"
    assert settings.plugins_folder == tmp_path / "plugins"
    assert settings.file_timeout_s == 7.0
    assert (settings.list_interval_s, settings.refresh_interval_s) == (11.0, 600.0)


def test_list_dag_files_skips_hidden_caches_and_plugins(tmp_path: Path) -> None:
    for name in ("a.py", "sub/b.py", ".hidden.py", ".git/c.py", "__pycache__/d.py", "p/e.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "notes.txt").write_text("")
    found = list_dag_files(tmp_path, skip=tmp_path / "p")
    assert found == [tmp_path / "a.py", tmp_path / "sub" / "b.py"]
    assert list_dag_files(tmp_path / "missing") is None


def test_the_queue_of_each_task_is_parsed(tmp_path: Path) -> None:
    source = """
    from engine import DAG, task

    @task
    def noop():
        return None

    with DAG("queues", schedule=None):
        noop.override(task_id="gpu", queue="gpu")()
        noop.override(task_id="plain")()
    """
    result = parse_file(write(tmp_path, "queues.py", source))
    assert result.ok, result.error
    (dag,) = result.dags
    assert {t.task_id: t.queue for t in dag.tasks} == {"gpu": "gpu", "plain": None}


def test_a_result_is_written_as_the_json_of_its_fields_and_read_back_the_same() -> None:
    task_ = ParsedTask(
        task_id="a",
        operator="engine.authoring.operators.PythonOperator",
        downstream=("b",),
        mapping={"kind": "expand", "args": [1, 2]},
        edge_labels={"b": "then"},
    )
    dag = ParsedDag(
        dag_id="d",
        tasks=(task_,),
        schedule={"all": ["x"]},
        params={"p": {"default": 1}},
        deadline_alerts=({"after_s": 60},),
        tags=("t",),
    )
    watcher = ParsedWatcher(name="w", classpath="triggers.FileTrigger", kwargs="{}")
    asset = ParsedAsset(name="x", uri="s3://b/x", extra={"e": 1}, watchers=(watcher,))
    result = FileParseResult(
        fileloc="/dags/d.py",
        dags=(dag,),
        assets=(asset,),
        error=ParseError("ValueError", "bad", 3, "Traceback"),
        source_sha256="abc",
        source="text",
        imports=("/dags/helper.py",),
    )
    text = result.to_json()
    assert text == json.dumps(asdict(result), sort_keys=True, separators=(",", ":"))
    assert FileParseResult.from_json(text) == result
