"""The foundation through the real ``sluice`` CLI: config, db commands, key rotation."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, update

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Trigger
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from tests.cli import invoke
from tests.e2e.helpers import run_cli, sluice_env

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

SECRET = "s3cr3t-password-value"


def test_version_and_help(sluice_home: Path) -> None:
    env = sluice_env(sluice_home)
    assert run_cli("version", env=env).stdout.strip() == "0.1.0"
    out = run_cli("--help", env=env).stdout
    for command in ("config", "db", "run", "triggerer", "version"):
        assert command in out


def test_config_show_precedence_sources_and_redaction(sluice_home: Path) -> None:
    key = Fernet.generate_key().decode()
    (sluice_home / "sluice.toml").write_text(
        f'[core]\nfernet_key = "{key}"\n'
        'sql_alchemy_conn = "postgresql+psycopg://u:hunter2@db/x"\n'
        "[triggerer]\ncapacity = 50\njob_heartbeat_sec = 2\n"
    )
    env = sluice_env(sluice_home, SLUICE__TRIGGERER__CAPACITY="70")
    result = invoke("config", "show", "--json", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["triggerer"]["capacity"] == 70  # env over file
    assert shown["triggerer"]["job_heartbeat_sec"] == 2.0  # file over default
    assert shown["triggerer"]["shared_stream_ack_timeout"] == 300.0  # default
    text = invoke("config", "show", env=env).stdout
    assert "env SLUICE__TRIGGERER__CAPACITY" in text
    for leaked in (key, "hunter2"):
        assert leaked not in result.stdout
        assert leaked not in text


@pytest.mark.parametrize(
    ("toml", "env", "needle"),
    [
        ("[triggerer]\ncapacityy = 5\n", {}, "triggerer.capacityy"),
        ("[triggerer]\ncapacity = 'many'\n", {}, "triggerer.capacity"),
        ("[core\n", {}, "line 1"),
        ("", {"SLUICE__TRIGGERER__CAPACITY": "lots"}, "SLUICE__TRIGGERER__CAPACITY"),
        ("", {"SLUICE__NOPE__X": "1"}, "SLUICE__NOPE__X"),
    ],
)
def test_bad_config_is_an_error_naming_key_and_source(
    sluice_home: Path, toml: str, env: dict[str, str], needle: str
) -> None:
    (sluice_home / "sluice.toml").write_text(toml)
    result = invoke("config", "show", env=sluice_env(sluice_home, **env))
    assert result.returncode == 1
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.both_databases
def test_db_commands_on_both_databases(db_url: str, sluice_home: Path) -> None:
    env = sluice_env(sluice_home, SLUICE__CORE__SQL_ALCHEMY_CONN=db_url)
    before = invoke("db", "check", env=env)
    assert before.returncode == 1
    assert "sluice db migrate" in before.stderr
    migrated = invoke("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert "to 0001" in migrated.stdout or "from empty" in migrated.stdout
    check = invoke("db", "check", env=env)
    assert check.returncode == 0, check.stderr
    assert "current" in check.stdout
    refused = invoke("db", "reset", env=env)
    assert refused.returncode == 1
    assert "--yes" in refused.stderr
    assert invoke("db", "reset", "--yes", env=env).returncode == 0
    assert invoke("db", "check", env=env).returncode == 0


def _add(db: Database, cipher: KwargsCipher, n: int) -> list[int]:
    return db.call(
        lambda s: [
            trigger_rows.add_trigger_row(
                s,
                cipher,
                "triggers.file.FileTrigger",
                {"filepath": f"/data/{i}", "password": SECRET},
                kind=TriggerKind.TASK,
            )
            for i in range(n)
        ]
    )


def test_no_plaintext_kwarg_reaches_the_sqlite_file(sluice_home: Path) -> None:
    url = f"sqlite:///{sluice_home / 'sluice.db'}"
    env = sluice_env(sluice_home, SLUICE__CORE__SQL_ALCHEMY_CONN=url)
    assert invoke("db", "migrate", env=env).returncode == 0
    db = Database(url)
    _add(db, KwargsCipher.from_config("", sluice_home), 20)
    db.dispose()
    # The main file and the write-ahead log together hold everything written.
    files = list(sluice_home.glob("sluice.db*"))
    raw = b"".join(p.read_bytes() for p in files)
    assert b"triggers.file.FileTrigger" in raw  # the rows are there, readable as such
    assert SECRET.encode() not in raw
    assert b"/data/1" not in raw
    assert (sluice_home / "fernet.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.both_databases
def test_rotate_fernet_key_reencrypts_and_reports_bad_rows(db_url: str, sluice_home: Path) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    env = sluice_env(sluice_home, SLUICE__CORE__SQL_ALCHEMY_CONN=db_url)
    assert invoke("db", "migrate", env=env).returncode == 0
    db = Database(db_url)
    ids = _add(db, KwargsCipher(old), 5)
    bad = ids[2]
    db.call(lambda s: s.execute(update(Trigger).where(Trigger.id == bad).values(kwargs="garbage")))

    result = invoke(
        "db", "rotate-fernet-key", env={**env, "SLUICE__CORE__FERNET_KEY": f"{new},{old}"}
    )
    assert result.returncode == 1
    assert "re-encrypted 4 value(s)" in result.stdout
    assert f"trigger {bad}" in result.stderr
    assert SECRET not in result.stdout + result.stderr

    only_new = KwargsCipher(new)
    rows = db.call(lambda s: s.execute(select(Trigger.id, Trigger.kwargs)).all())
    for trigger_id, token in rows:
        if trigger_id != bad:
            assert only_new.decrypt_kwargs(token, trigger_id=trigger_id)["password"] == SECRET
    db.dispose()
