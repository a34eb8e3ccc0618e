"""A task whose DAG file broke meanwhile runs the file's last good version.

Real DAG files parsed by the real DAG processor, real task processes started by the local
executor, on SQLite and PostgreSQL. The run is created while the file is good; the file is
then broken (a syntax error, a task removed, a helper module broken) before its task runs.
"""

from __future__ import annotations

import textwrap
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, update

from engine.authoring.dag_files import source_digest
from engine.crypto import KwargsCipher
from engine.dag_processing.parsing import FileParseResult
from engine.db import models
from engine.db.models import DagFile, TaskInstance
from engine.db.queries import runs
from engine.db.queries.triggers import rotate_trigger_kwargs
from engine.executor.task_logs import read_task_log
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually, wait_until
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from engine.executor.local import LocalExecutor
    from tests.integration.harness import Parsed

pytestmark = pytest.mark.integration

GOOD = """
from engine import DAG, task

import helper


@task
def first():
    return "first ran"


@task
def second():
    print("the good version runs")
    return helper.VERSION


with DAG("versions"):
    first() >> second()
"""
HELPER = 'VERSION = "v1"\n'
LAST_GOOD_LINE = "running the last good version of it, parsed at"


class Env:
    def __init__(self, parsed: Parsed, dags: Path) -> None:
        self.db, self.config, self.cipher, self.processor = parsed
        self.dags = dags
        self.file = dags / "versions.py"
        self.settings = fast_executor_settings(self.config)

    def new_run(self) -> tuple[str, dict[str, int]]:
        def create(session: Any) -> tuple[str, dict[str, int]]:
            pk = runs.create_run(session, "versions", run_type=runs.MANUAL, now=models.utcnow())
            state = runs.load_run_state(session, pk)
            assert state is not None
            run_id = session.execute(
                select(models.DagRun.run_id).where(models.DagRun.id == pk)
            ).scalar_one()
            return str(run_id), state.ti_ids

        return self.db.call(create)

    def parse(self) -> Any:
        return anyio.run(self.processor.parse_once)

    def stored(self) -> tuple[FileParseResult, str | None]:
        """The stored last good parse of the file and its source (decrypted)."""
        row = self.db.call(
            lambda s: s.execute(
                select(DagFile.result, DagFile.source).where(DagFile.fileloc == str(self.file))
            ).one()
        )
        result = FileParseResult.from_json(self.cipher.decrypt(row.result))
        return result, None if row.source is None else self.cipher.decrypt(row.source)

    async def run_task(self, ti_id: int) -> TaskInstance:
        """Schedule the task instance and run it with a real executor until it ends."""
        self.db.call(
            lambda s: s.execute(
                update(TaskInstance)
                .where(TaskInstance.id == ti_id)
                .values(state=TaskState.SCHEDULED)
            )
        )

        async def ended() -> TaskInstance | None:
            ti = await self.db.run(lambda s: s.get(TaskInstance, ti_id))
            return ti if ti.state in (TaskState.SUCCESS, TaskState.FAILED) else None

        async with self.executor() as executor:
            ti = await eventually(ended, within=60)
            await wait_until(lambda: executor.running == 0, within=30)
        return ti

    @asynccontextmanager
    async def executor(self) -> AsyncIterator[LocalExecutor]:
        async with running_executor(self.db, self.cipher, self.settings) as executor:
            yield executor

    def log(self, run_id: str, task_id: str) -> str:
        return read_task_log(self.settings.task_log_folder, "versions", run_id, task_id, None)


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "versions.py").write_text(textwrap.dedent(GOOD))
    (dags / "helper.py").write_text(HELPER)
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(parsed, dags)
    parsed.db.dispose()


def _value(ti: TaskInstance) -> Any:
    assert ti.xcoms is not None, ti.state
    return deserialize_value(ti.xcoms["return_value"])


@pytest.mark.both_databases
def test_a_good_parse_stores_the_source_it_ran_and_a_broken_one_keeps_it(env: Env) -> None:
    good = textwrap.dedent(GOOD)
    result, source = env.stored()
    assert source == good and result.source_sha256 == source_digest(good.encode())
    assert result.source is None  # the result document does not hold the source
    # A change of code only (the DAG's shape is the same) is a new version.
    edited = good.replace('print("the good version runs")', 'print("edited")')
    env.file.write_text(edited)
    assert not env.parse().errors
    result, source = env.stored()
    assert source == edited and result.source_sha256 == source_digest(edited.encode())
    # A broken file keeps the last good version.
    env.file.write_text(edited + "\ndef broken(:\n")
    assert str(env.file) in env.parse().errors
    assert env.stored()[1] == edited
    # `sluice db rotate-fernet-key` re-encrypts the stored source too.
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    old = KwargsCipher(old_key)
    document = result.without_source().to_json()
    env.db.call(
        lambda s: s.execute(
            update(DagFile).values(result=old.encrypt(document), source=old.encrypt(edited))
        )
    )
    rotating = KwargsCipher(f"{new_key},{old_key}")
    failures = env.db.call(lambda s: rotate_trigger_kwargs(s, rotating))[1]
    assert [f for f in failures if "versions.py" in f.error] == []
    env.cipher = KwargsCipher(new_key)  # the old key is gone: both decrypt with the new one
    assert env.stored()[1] == edited


async def test_a_run_started_before_the_file_broke_completes_with_the_last_good_code(
    env: Env,
) -> None:
    run_id, tis = env.new_run()
    with anyio.fail_after(120):
        first = await env.run_task(tis["first"])
        assert first.state == TaskState.SUCCESS
        env.file.write_text(textwrap.dedent(GOOD) + "\ndef broken(:\n")  # saved mid-run
        assert str(env.file) in (await env.processor.parse_once()).errors
        second = await env.run_task(tis["second"])
    assert second.state == TaskState.SUCCESS, env.log(run_id, "second")
    assert _value(second) == "v1"
    text = env.log(run_id, "second")
    assert "the good version runs" in text
    [warning] = [line for line in text.splitlines() if LAST_GOOD_LINE in line]
    assert "WARNING" in warning and str(env.file) in warning
    assert "SyntaxError" in warning  # the parse error, with where
    assert "the DAG processor reports:" in warning
    assert "`sluice dags errors`" in warning


async def test_a_task_the_file_no_longer_defines_fails_when_the_file_parses(env: Env) -> None:
    """Changed incompatibly but the file is fine (no parse error recorded, before the DAG
    processor saw it or after): the task fails with the real error, not the old code."""
    run_id, tis = env.new_run()
    env.file.write_text(textwrap.dedent(GOOD).replace("first() >> second()", "first()"))
    with anyio.fail_after(60):
        second = await env.run_task(tis["second"])
    assert second.state == TaskState.FAILED
    text = env.log(run_id, "second")
    assert "has no task 'second'" in text and LAST_GOOD_LINE not in text


async def test_an_import_failure_without_a_recorded_parse_error_fails_with_the_real_error(
    env: Env,
) -> None:
    """The file on disk differs from the stored version and fails to import on this worker
    (a module missing here), but the DAG processor recorded no parse error for it: the task
    fails with the import error instead of silently running the previous version."""
    run_id, tis = env.new_run()
    edited = textwrap.dedent(GOOD).replace("import helper\n", "import helper\nimport not_here\n")
    env.file.write_text(edited)
    with anyio.fail_after(60):
        second = await env.run_task(tis["second"])
    assert second.state == TaskState.FAILED
    text = env.log(run_id, "second")
    assert "ModuleNotFoundError" in text and "not_here" in text
    assert LAST_GOOD_LINE not in text and "the good version runs" not in text


async def test_a_good_change_runs_from_disk_without_a_word(env: Env) -> None:
    run_id, tis = env.new_run()
    env.file.write_text(textwrap.dedent(GOOD).replace("helper.VERSION", '"v2 from disk"'))
    with anyio.fail_after(60):
        second = await env.run_task(tis["second"])
    assert _value(second) == "v2 from disk"
    assert LAST_GOOD_LINE not in env.log(run_id, "second")


async def test_a_file_that_fails_as_stored_fails_with_its_own_error(env: Env) -> None:
    """The DAG file is what was parsed, but a module it imports broke: its last good
    version would fail the same way, so the task fails with the real error."""
    run_id, tis = env.new_run()
    (env.dags / "helper.py").write_text("VERSION = (\n")
    with anyio.fail_after(60):
        second = await env.run_task(tis["second"])
    assert second.state == TaskState.FAILED
    text = env.log(run_id, "second")
    assert "helper.py" in text and "SyntaxError" in text
    assert LAST_GOOD_LINE not in text


async def test_without_a_stored_source_the_broken_file_fails_the_task(env: Env) -> None:
    """A row written before the source was kept (or never parsed well): the error stands."""
    run_id, tis = env.new_run()
    env.db.call(lambda s: s.execute(update(DagFile).values(source=None)))
    env.file.write_text("def broken(:\n")
    with anyio.fail_after(60):
        second = await env.run_task(tis["second"])
    assert second.state == TaskState.FAILED
    text = env.log(run_id, "second")
    assert "SyntaxError" in text and LAST_GOOD_LINE not in text
