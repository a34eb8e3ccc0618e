"""Connections and variables without a database: Airflow's URI and JSON forms, masking, the
environment overrides, the store of the current process, and the template accessors."""

from __future__ import annotations

import json
import traceback
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Connection, Variable
from engine.authoring.connections import (
    InvalidConnectionError,
    is_sensitive,
    mask_extra,
    parse_connection,
)
from engine.authoring.store import StoreUnavailableError, install_store
from engine.exceptions import AirflowNotFoundException
from engine.execution.templates import render_template
from engine.hooks.base import BaseHook


class FakeStore:
    """A store in memory that records what it was asked to mask."""

    def __init__(self) -> None:
        self.connections: dict[str, dict[str, Any]] = {}
        self.variables: dict[str, str] = {}
        self.masked: list[str] = []

    def get_connection(self, conn_id: str) -> dict[str, Any] | None:
        return self.connections.get(conn_id)

    def get_variable(self, key: str) -> str | None:
        return self.variables.get(key)

    def set_variable(self, key: str, value: str, description: str | None) -> None:
        self.variables[key] = value

    def delete_variable(self, key: str) -> int:
        return 1 if self.variables.pop(key, None) is not None else 0

    def mask(self, secrets: list[str]) -> None:
        self.masked.extend(secrets)


@pytest.fixture
def store() -> Any:
    fake = FakeStore()
    previous = install_store(fake)
    yield fake
    install_store(previous)


# --- the URI form ---------------------------------------------------------------------------

URIS = [
    (
        "postgres://user:p%40ss@host:5432/db?sslmode=require&extra__x=1",
        {
            "conn_type": "postgres",
            "host": "host",
            "login": "user",
            "password": "p@ss",
            "port": 5432,
            "schema": "db",
            "extra": {"sslmode": "require", "extra__x": "1"},
        },
    ),
    (
        "postgresql://u@h/d",
        {"conn_type": "postgres", "host": "h", "login": "u", "password": None, "schema": "d"},
    ),
    (
        "google-cloud-platform://?__extra__=%7B%22nested%22%3A+%7B%22a%22%3A+1%7D%7D",
        {"conn_type": "google_cloud_platform", "host": None, "extra": {"nested": {"a": 1}}},
    ),
    (
        "http://https%3A%2F%2Fexample.com:443/x",
        {"conn_type": "http", "host": "https://example.com", "port": 443, "schema": "x"},
    ),
    (
        "http://https://example.com/api",
        {"conn_type": "http", "host": "https://example.com", "schema": "api"},
    ),
    ("aws://AKIA:se%2Fcr%3Aet@", {"login": "AKIA", "password": "se/cr:et", "host": None}),
]


@pytest.mark.parametrize(("uri", "expected"), URIS)
def test_uri_parts_are_percent_decoded(uri: str, expected: dict[str, Any]) -> None:
    fields = Connection.from_uri("c", uri).to_dict()
    assert {k: fields[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("no-scheme", "invalid URI"),
        ("a://b://c://d", "more than two"),
        ("http://h:notaport", "invalid URI"),
        ("http://h?__extra__=%7Bbad", "__extra__ is not valid JSON"),
        ("http://h?__extra__=%7B%7D&other=1", "must be the only"),
    ],
)
def test_a_malformed_uri_is_an_error_naming_the_connection(uri: str, message: str) -> None:
    with pytest.raises(InvalidConnectionError, match=f"connection 'c'.*{message}"):
        Connection.from_uri("c", uri)


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    login=st.none() | text,
    password=st.none() | text.filter(bool),
    host=st.none() | st.from_regex(r"[a-z][a-z0-9.-]{0,10}", fullmatch=True),
    port=st.none() | st.integers(1, 65535),
    schema=st.none() | text.filter(bool),
    extra=st.dictionaries(st.from_regex(r"[a-z_.]{1,8}", fullmatch=True), text | st.integers()),
)
def test_get_uri_round_trips(
    login: str | None,
    password: str | None,
    host: str | None,
    port: int | None,
    schema: str | None,
    extra: dict[str, Any],
) -> None:
    conn = Connection(
        "c",
        conn_type="my_type",
        login=login or None,
        password=password,
        host=host,
        port=port,
        schema=schema,
        extra=extra,
    )
    assert Connection.from_uri("c", conn.get_uri()).to_dict() == conn.to_dict()


def test_the_json_form_and_its_errors() -> None:
    conn = parse_connection(
        "j", '{"conn_type": "http", "host": "h", "port": "80", "extra": {"a": [1, 2]}}'
    )
    assert (conn.conn_type, conn.host, conn.port, conn.extra_dejson) == (
        "http",
        "h",
        80,
        {"a": [1, 2]},
    )
    with pytest.raises(InvalidConnectionError, match="connection 'j': unknown field"):
        parse_connection("j", '{"conn_type": "http", "hots": "h"}')
    with pytest.raises(InvalidConnectionError, match="connection 'j': invalid JSON"):
        parse_connection("j", "{nope")
    with pytest.raises(InvalidConnectionError, match="port is out of range"):
        parse_connection("j", '{"conn_type": "http", "port": 70000}')


SECRET = "s3cr3tPart"


@pytest.mark.parametrize(
    "text",
    [
        f"postgres://user:{SECRET}/rest@host/db",  # the password's "/" ends the authority
        f"postgres://user:{SECRET}#rest@host/db",
        f"postgres://user:{SECRET}?rest@host/db",
        f"postgres://user:1234/{SECRET}@host/db",  # a numeric "port": silently misparsed
        f"postgres://user:1234?{SECRET}@host/db",
        f"postgres://user:1234#{SECRET}@host/db",
        f"postgres://user@example.com:1234/{SECRET}@host/db",
        f"postgres://user:99999/{SECRET}@host/db",  # the "port" is out of range
        f"postgres://user:[{SECRET}@host/db",
        f"postgres://[{SECRET}]/db",
        f"http://h?__extra__=%7B%22password%22%3A%22{SECRET}",
        f"http://h?__extra__=%5B%22{SECRET}%22%5D",
        f'{{"conn_type": "x", "password": "{SECRET}}}',
        f'{{"conn_type": "x", "password": "\\{SECRET}"}}',
        f'{{"conn_type": "x", "password": "{SECRET}", "port": "{SECRET}"}}',
        f'{{"conn_type": "x", "password": "a", "{SECRET} b": 1}}',
        f'{{"conn_type": "x", "extra": "{{\\"password\\": \\"{SECRET}"}}',
        f'{{"conn_type": "x", "extra": ["{SECRET}"]}}',
    ],
)
def test_an_error_quotes_nothing_of_the_connection_text(text: str) -> None:
    """Parse errors reach logs, trigger rows, tracebacks and the CLI before anything masks
    the password: they name the connection, never the text (nor chain an error that does)."""
    with pytest.raises(InvalidConnectionError) as caught:
        parse_connection("c", text)
    shown = "".join(traceback.format_exception(caught.value))
    assert "connection 'c'" in str(caught.value)
    assert SECRET not in shown
    assert "s3cr3t" not in shown.lower()


def test_an_unencoded_special_character_in_the_password_says_how_to_encode_it() -> None:
    with pytest.raises(InvalidConnectionError, match=r"percent-encode it.*%2F for /"):
        Connection.from_uri("x", "postgres://user:a/b@host/db")
    encoded = Connection.from_uri("x", "postgres://user:a%2Fb%23c%3Fd@host/db")
    assert (encoded.password, encoded.host, encoded.schema) == ("a/b#c?d", "host", "db")
    kept = Connection.from_uri("x", "smtp://mail.example.com:25?from=me@example.com")
    assert (kept.port, kept.extra_dejson) == (25, {"from": "me@example.com"})


# --- masking ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "sensitive"),
    [
        ("password", True),
        ("DB_PASSWORD", True),
        ("api_key", True),
        ("my_secret_value", True),
        ("access_token", True),
        ("private_key", True),
        ("region", False),
        ("host", False),
    ],
)
def test_sensitive_names_follow_airflow(name: str, sensitive: bool) -> None:
    assert is_sensitive(name) is sensitive


def test_masking_a_connection_hides_its_secrets_only() -> None:
    conn = Connection(
        "c",
        conn_type="kafka",
        host="h",
        login="u",
        password="pw-12345",
        extra={"sasl.password": "x-987", "nested": {"token": "t-1"}, "region": "eu"},
    )
    assert conn.masked_dict()["password"] == "***"
    assert conn.masked_dict()["extra"] == {
        "sasl.password": "***",
        "nested": {"token": "***"},
        "region": "eu",
    }
    assert sorted(conn.secrets()) == ["pw-12345", "t-1", "x-987"]
    assert conn.masked_uri().startswith("kafka://u:***@h?")
    assert mask_extra(["a", {"secret": ""}]) == ["a", {"secret": ""}]


# --- lookups: environment first, then the store ------------------------------------------------


def test_the_environment_wins_over_the_store(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store.connections["my_db"] = {"conn_type": "postgres", "host": "from-store"}
    assert Connection.get("my_db").host == "from-store"
    monkeypatch.setenv("SLUICE_CONN_MY_DB", "postgres://u:env-pw-1@from-env:1/d")
    conn = Connection.get("my_db")
    assert (conn.host, conn.password, conn.port) == ("from-env", "env-pw-1", 1)
    assert "env-pw-1" in store.masked  # an environment secret is masked too
    monkeypatch.setenv("SLUICE_CONN_MY_DB", '{"conn_type": "http", "host": "json-host"}')
    assert BaseHook.get_connection("my_db").host == "json-host"
    store.variables["region"] = "from-store"
    monkeypatch.setenv("SLUICE_VAR_REGION", "from-env")
    assert Variable.get("region") == "from-env"


def test_variables_through_the_store(store: Any) -> None:
    Variable.set("cfg", {"a": [1, 2]}, serialize_json=True)
    assert Variable.get("cfg", deserialize_json=True) == {"a": [1, 2]}
    assert json.loads(store.variables["cfg"]) == {"a": [1, 2]}
    assert Variable.get("missing", default=None) is None
    with pytest.raises(KeyError, match="Variable missing does not exist"):
        Variable.get("missing")
    Variable.set("n", 3)
    assert Variable.get("n") == "3"
    assert Variable.delete("n") == 1
    with pytest.raises(AirflowNotFoundException, match="SLUICE_CONN_NOWHERE"):
        Connection.get("nowhere")


def test_without_a_store_only_the_environment_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = install_store(None)
    try:
        with pytest.raises(StoreUnavailableError, match="inside a task"):
            Variable.get("x")
        with pytest.raises(StoreUnavailableError, match=r"Connection.get\('c'\)"):
            Connection.get("c")
        monkeypatch.setenv("SLUICE_VAR_X", "env")
        assert Variable.get("x") == "env"
    finally:
        install_store(previous)


def test_templates_read_var_and_conn(store: Any) -> None:
    store.variables.update(plain="hello", settings='{"size": 3, "inner": {"k": "v"}}')
    store.connections["my_id"] = {"conn_type": "http", "host": "h.example", "login": "me"}
    rendered = render_template(
        "{{ var.value.plain }} {{ var.json.settings.size }} {{ var.json.settings.inner.k }} "
        "{{ conn.my_id.host }} {{ conn.get('my_id').login }} {{ var.value.get('no', 'dflt') }}",
        {},
    )
    assert rendered == "hello 3 v h.example me dflt"


def test_top_level_reads_in_a_dag_file_fail_its_parse_with_a_clear_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.dag_processing.parsing import parse_file

    path = tmp_path / "top_level.py"
    path.write_text(
        "from engine import DAG, Variable\n"
        "limit = Variable.get('limit')\n"
        "with DAG('d'):\n"
        "    pass\n"
    )
    previous = install_store(None)  # as in the DAG processor's child
    try:
        result = parse_file(path)
        assert result.error is not None
        assert "Variable.get('limit')" in result.error.message
        assert "inside a task" in result.error.message and result.error.lineno == 2
        monkeypatch.setenv("SLUICE_VAR_LIMIT", "10")  # the environment answers everywhere
        assert parse_file(path).error is None
    finally:
        install_store(previous)
