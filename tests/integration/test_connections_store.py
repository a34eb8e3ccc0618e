"""Connections and variables in the metadata database, on SQLite and PostgreSQL: stored
encrypted (the raw rows never hold a secret), read back, listed, deleted and re-encrypted by
key rotation, through the queries and through ``sluice connections|variables``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import text

from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.db.queries import connections as store
from engine.exceptions import DecryptionError
from tests.integration.test_backfill import config, db, run_cli

if TYPE_CHECKING:
    from pathlib import Path

    from click.testing import Result

    from engine.config import Config
    from engine.db.database import Database

pytestmark = pytest.mark.integration

__all__ = ("config", "db")  # the fixtures, used by name

PASSWORD = "p@ss-w0rd/with:chars"
URI = "postgres://etl:p%40ss-w0rd%2Fwith%3Achars@db.example.com:5432/sales?sslmode=require"


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def _failed(result: Result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert message in result.stderr, result.stderr


def _raw(db: Database, table: str) -> str:
    rows = db.call(lambda s: s.execute(text(f"SELECT * FROM {table}")).all())
    return repr([tuple(row) for row in rows])


def _cipher(config: Config) -> KwargsCipher:
    return KwargsCipher.from_config(config.core.fernet_key, config.home)


@pytest.mark.both_databases
def test_secrets_are_encrypted_at_rest_and_read_back(db: Database) -> None:
    cipher = KwargsCipher(Fernet.generate_key().decode())
    fields = {
        "conn_type": "postgres",
        "host": "db.example.com",
        "port": 5432,
        "login": "etl",
        "password": PASSWORD,
        "schema": "sales",
        "description": "the warehouse",
        "extra": {"sslmode": "require", "api_key": "k-987654"},
    }
    assert db.call(lambda s: store.upsert_connection(s, cipher, "wh", fields)) is True
    assert db.call(lambda s: store.set_variable(s, cipher, "token", "t-123456", "a token"))
    raw = _raw(db, "connection") + _raw(db, "variable")
    for secret in (PASSWORD, "k-987654", "sslmode", "t-123456"):
        assert secret not in raw
    assert "db.example.com" in raw  # only the secrets are encrypted
    assert db.call(lambda s: store.get_connection(s, cipher, "wh")) == fields
    assert db.call(lambda s: store.get_variable(s, cipher, "token")) == "t-123456"
    replaced = {**fields, "password": None, "extra": {}}
    assert db.call(lambda s: store.upsert_connection(s, cipher, "wh", replaced)) is False
    assert db.call(lambda s: store.get_connection(s, cipher, "wh"))["password"] is None
    assert db.call(lambda s: store.list_variables(s, cipher)) == [("token", "t-123456", "a token")]
    assert db.call(lambda s: store.delete_variable(s, "token")) == 1
    assert db.call(lambda s: store.delete_variable(s, "token")) == 0
    assert db.call(lambda s: store.delete_connection(s, "wh")) is True
    assert db.call(lambda s: store.get_connection(s, cipher, "wh")) is None


def test_a_wrong_key_names_the_connection_or_variable(db: Database) -> None:
    right = KwargsCipher(Fernet.generate_key().decode())
    wrong = KwargsCipher(Fernet.generate_key().decode())
    fields = {"conn_type": "http", "host": "h", "password": PASSWORD}
    db.call(lambda s: store.upsert_connection(s, right, "api", fields))
    db.call(lambda s: store.set_variable(s, right, "v", "value"))
    with pytest.raises(DecryptionError, match=r"connection 'api' \(its password\)"):
        db.call(lambda s: store.get_connection(s, wrong, "api"))
    with pytest.raises(DecryptionError, match=r"variable 'v'.*fernet_key"):
        db.call(lambda s: store.get_variable(s, wrong, "v"))


@pytest.mark.both_databases
def test_key_rotation_re_encrypts_connections_and_variables(db: Database) -> None:
    from engine.db.queries.triggers import rotate_trigger_kwargs

    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    old = KwargsCipher(old_key)
    db.call(lambda s: store.upsert_connection(s, old, "c", {"conn_type": "x", "password": "pw1"}))
    db.call(lambda s: store.set_variable(s, old, "v", "value"))
    both = KwargsCipher(f"{new_key},{old_key}")
    rotated, failures = db.call(lambda s: rotate_trigger_kwargs(s, both))
    assert (rotated, failures) == (2, [])
    new_only = KwargsCipher(new_key)
    assert db.call(lambda s: store.get_connection(s, new_only, "c"))["password"] == "pw1"
    assert db.call(lambda s: store.get_variable(s, new_only, "v")) == "value"


# --- the CLI --------------------------------------------------------------------------------


def test_connections_commands(config: Config, db: Database) -> None:
    out = _ok(run_cli(config, "connections", "add", "wh", "--conn-uri", URI))
    assert out.strip() == (
        "added connection wh: postgres://etl:***@db.example.com:5432/sales?sslmode=require"
    )
    _ok(
        run_cli(
            config,
            *("connections", "add", "kafka_default", "--conn-type", "kafka"),
            *("--conn-host", "broker", "--conn-port", "9092", "--conn-login", "u"),
            *("--conn-password", "kpw-secret", "--conn-extra", '{"sasl.password": "xyz-123"}'),
        )
    )
    _ok(run_cli(config, "connections", "add", "j", "--conn-json", '{"conn_type": "http"}'))
    _failed(run_cli(config, "connections", "add", "wh", "--conn-uri", URI), "already exists")
    _failed(run_cli(config, "connections", "add", "x", "--conn-uri", "nonsense"), "connection 'x'")
    leaky = run_cli(config, "connections", "add", "x", "--conn-uri", "pg://u:s3cr3tPart/r@h/db")
    _failed(leaky, "percent-encode it")
    assert "s3cr3t" not in leaky.output
    _failed(
        run_cli(config, "connections", "add", "x", "--conn-uri", URI, "--conn-host", "h"),
        "cannot go with",
    )
    listed = _ok(run_cli(config, "connections", "list"))
    assert "kpw-secret" not in listed and "xyz-123" not in listed and PASSWORD not in listed
    rows = json.loads(_ok(run_cli(config, "connections", "list", "--json")))
    assert [r["conn_id"] for r in rows] == ["j", "kafka_default", "wh"]
    assert rows[1]["password"] == "***" and rows[1]["extra"] == {"sasl.password": "***"}
    shown = _ok(run_cli(config, "connections", "get", "wh"))
    assert "password     ***" in shown and PASSWORD not in shown
    clear = json.loads(_ok(run_cli(config, "connections", "get", "wh", "--json", "--show-secret")))
    assert clear["password"] == PASSWORD and clear["uri"] == URI
    assert PASSWORD not in _raw(db, "connection")
    _ok(run_cli(config, "connections", "delete", "wh"))
    _failed(run_cli(config, "connections", "get", "wh"), "no connection with conn_id 'wh'")
    _failed(run_cli(config, "connections", "delete", "wh"), "no connection")


def test_variables_commands(config: Config, db: Database) -> None:
    assert _ok(run_cli(config, "variables", "set", "region", "eu-west-1")).strip() == (
        "created variable region"
    )
    _ok(run_cli(config, "variables", "set", "api_token", "tok-999888", "--description", "d"))
    _ok(run_cli(config, "variables", "set", "cfg", '{"size": 3}', "--json"))
    _failed(run_cli(config, "variables", "set", "bad", "{nope", "--json"), "not JSON")
    assert _ok(run_cli(config, "variables", "get", "region")).strip() == "eu-west-1"
    assert _ok(run_cli(config, "variables", "get", "api_token")).strip() == "***"
    assert _ok(run_cli(config, "variables", "get", "api_token", "--show-secret")).strip() == (
        "tok-999888"
    )
    assert json.loads(_ok(run_cli(config, "variables", "get", "cfg", "--json"))) == {"size": 3}
    rows = json.loads(_ok(run_cli(config, "variables", "list", "--json")))
    assert rows == [
        {"key": "api_token", "value": "***", "description": "d"},
        {"key": "cfg", "value": '{\n  "size": 3\n}', "description": None},
        {"key": "region", "value": "eu-west-1", "description": None},
    ]
    assert "tok-999888" not in _raw(db, "variable")
    _failed(run_cli(config, "variables", "get", "nope"), "variable 'nope' does not exist")
    assert _ok(run_cli(config, "variables", "get", "nope", "--default", "d")).strip() == "d"
    _ok(run_cli(config, "variables", "delete", "region"))
    _failed(run_cli(config, "variables", "delete", "region"), "does not exist")


def test_the_cli_names_what_a_wrong_key_cannot_decrypt(
    config: Config, db: Database, tmp_path: Path
) -> None:
    _ok(run_cli(config, "connections", "add", "c", "--conn-uri", "http://u:pw12345@h"))
    _ok(run_cli(config, "variables", "set", "v", "x"))
    other = load_config(
        environ={
            "SLUICE_HOME": str(tmp_path / "other"),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": db.url,
            "SLUICE__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        }
    )
    for args, what in (
        (("connections", "list"), "connection 'c' (its password)"),
        (("connections", "get", "c"), "connection 'c' (its password)"),
        (("variables", "get", "v"), "variable 'v'"),
    ):
        result = run_cli(other, *args)
        _failed(result, what)
        assert "Traceback" not in result.output and "fernet_key" in result.stderr
