"""The first run as a newcomer types it: a command that only reads never creates a
database (a second terminal without the engine's ``SLUICE_HOME`` would otherwise get an
empty one of its own), and says where it looked, which settings led there and how to create
one; an unmigrated database says so; an unknown run is named as such; a parse error names
its file and line once."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import pytest
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from tests.cli import invoke
from tests.integration.harness import parse_in_process, parsed_database

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

#: every command that only reads, with arguments it accepts (the objects need not exist)
READ_ONLY_COMMANDS = (
    ("dags", "list"),
    ("dags", "errors"),
    ("dags", "show", "d"),
    ("dags", "why", "d"),
    ("dags", "backfill", "d", "--from", "2026-01-01", "--to", "2026-01-02", "--dry-run"),
    ("runs", "list", "d"),
    ("assets", "list"),
    ("assets", "events", "a"),
    ("assets", "partitions", "a"),
    ("assets", "state", "a"),
    ("tasks", "list", "d", "r"),
    ("tasks", "logs", "d", "r", "t"),
    ("tasks", "result", "d", "r", "t"),
    ("tasks", "state", "d", "r", "t"),
    ("jobs", "list"),
    ("triggers", "list"),
    ("streams", "list"),
    ("pools", "list"),
    ("pools", "get", "p"),
    ("connections", "list"),
    ("connections", "get", "c"),
    ("variables", "list"),
    ("variables", "get", "k"),
    ("users", "list"),
    ("tokens", "list"),
    ("db", "check"),
    ("db", "clean", "--before", "30d", "--dry-run"),
)


@pytest.mark.parametrize("args", READ_ONLY_COMMANDS, ids=" ".join)
def test_a_read_only_command_creates_no_database(args: tuple[str, ...], tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = invoke(*args, env={"SLUICE_HOME": str(home)})
    assert result.returncode == 1, result
    assert f"no database exists at {home / 'sluice.db'}" in result.stderr
    assert f"SLUICE_HOME = {home} (from env SLUICE_HOME)" in result.stderr
    assert "(default: $SLUICE_HOME/sluice.db)" in result.stderr
    assert "`sluice db migrate`" in result.stderr
    assert not home.exists()  # neither the file nor its directory


def test_the_message_names_a_database_set_in_the_config_file(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere" / "metadata.db"
    home.mkdir()
    (home / "sluice.toml").write_text(f'[core]\nsql_alchemy_conn = "sqlite:///{elsewhere}"\n')
    result = invoke("runs", "list", "d", env={"SLUICE_HOME": str(home)})
    assert result.returncode == 1
    assert f"no database exists at {elsewhere}" in result.stderr
    assert f"(from {home / 'sluice.toml'})" in result.stderr
    assert not elsewhere.parent.exists()


def test_doctor_reports_the_missing_database_without_creating_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = invoke("doctor", env={"SLUICE_HOME": str(home)})
    assert result.returncode == 1
    assert f"ERROR [database] no database exists at {home / 'sluice.db'}" in result.stdout
    assert "sluice db migrate" in result.stdout
    assert not home.exists()


def test_a_writing_command_still_creates_the_database(tmp_path: Path) -> None:
    env = {"SLUICE_HOME": str(tmp_path / "home")}
    assert invoke("db", "migrate", env=env).returncode == 0
    assert (tmp_path / "home" / "sluice.db").is_file()
    listed = invoke("runs", "list", "d", env=env)
    assert listed.returncode == 1
    assert "no DAG 'd'" in listed.stderr  # the database is read: the DAG is unknown


def test_an_empty_sqlite_file_says_it_was_never_migrated(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "sluice.db").touch()
    result = invoke("runs", "list", "d", env={"SLUICE_HOME": str(home)})
    assert result.returncode == 1
    assert f"the database at {home / 'sluice.db'} has no Sluice schema" in result.stderr
    assert "`sluice db migrate`" in result.stderr


def test_an_unmigrated_postgres_database_says_so(pg_url: str, tmp_path: Path) -> None:
    env = {"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__SQL_ALCHEMY_CONN": pg_url}
    result = invoke("dags", "list", env=env)
    assert result.returncode == 1
    assert f"the database {pg_url} has no Sluice schema (never migrated)" in result.stderr
    assert "(from env SLUICE__CORE__SQL_ALCHEMY_CONN)" in result.stderr


DAG_FILE = """
from datetime import datetime

from engine import BashOperator, DAG

with DAG("first", start_date=datetime(2026, 1, 1), schedule=None):
    BashOperator(task_id="report", bash_command="echo hi")
"""


def test_an_unknown_run_is_named_as_the_unknown_thing(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "first.py").write_text(textwrap.dedent(DAG_FILE))
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    parsed.db.dispose()
    env = {"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__SQL_ALCHEMY_CONN": migrated_db_url}
    for command in ("logs", "result", "state"):
        result = invoke("tasks", command, "first", "manual__nope", "report", env=env)
        assert result.returncode == 1
        assert "no run 'manual__nope' of DAG 'first'" in result.stderr, result
        assert "no task" not in result.stderr


BAD_FILES = {
    "syntax.py": "x = (\n",
    "rule.py": """
        from datetime import datetime

        from engine import BashOperator, DAG

        with DAG("ruled", start_date=datetime(2026, 1, 1), schedule=None):
            BashOperator(task_id="t", bash_command="true", trigger_rule="nope")
        """,
}


def test_dags_errors_names_file_and_line_once(migrated_db_url: str, tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    for name, text in BAD_FILES.items():
        (dags / name).write_text(textwrap.dedent(text))
    db = Database(migrated_db_url)
    try:
        report = parse_in_process(db, KwargsCipher(Fernet.generate_key().decode()), dags)
    finally:
        db.dispose()
    assert len(report.errors) == 2
    env = {"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__SQL_ALCHEMY_CONN": migrated_db_url}
    result = invoke("dags", "errors", env=env)
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line, name in zip(lines, sorted(BAD_FILES), strict=True):
        assert line.startswith(f"{dags / name}:"), line
        assert line.count(name) == 1, line
    assert lines[0].startswith(f"{dags / 'rule.py'}:7: DagDefinitionError: task 't': trigger_rule")
    assert lines[1] == f"{dags / 'syntax.py'}:1: SyntaxError: '(' was never closed"
