"""The parsing child's store: reads asked of the DAG processor once per parse (cached,
missing ones too), read-only, and the environment without the engine's secrets."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from engine.authoring.store import StoreUnavailableError
from engine.dag_processing.parse_store import ParseRequestError, ParseTimeStore
from engine.logs import child_environment


def answering(answers: dict[tuple[str, str], dict]) -> tuple[ParseTimeStore, list[dict]]:
    """A store whose peer answers from ``answers`` ({(kind, name): answer fields})."""
    ours, theirs = socket.socketpair()
    asked: list[dict] = []

    def serve() -> None:
        with theirs, theirs.makefile("rb") as reader:
            for line in reader:
                request = json.loads(line)
                asked.append(request)
                name = request.get("key") or request.get("conn_id")
                answer = {"id": request["id"], **answers[(request["kind"], name)]}
                theirs.sendall(json.dumps(answer).encode() + b"\n")

    threading.Thread(target=serve, daemon=True).start()
    return ParseTimeStore(ours), asked


def test_reads_are_asked_once_per_parse() -> None:
    store, asked = answering(
        {
            ("get_variable", "k"): {"ok": True, "value": "v"},
            ("get_variable", "gone"): {"ok": False, "not_found": True, "error": "x"},
            ("get_connection", "pg"): {"ok": True, "value": {"host": "h"}},
        }
    )
    try:
        assert [store.get_variable("k") for _ in range(3)] == ["v", "v", "v"]
        assert store.get_variable("gone") is None and store.get_variable("gone") is None
        assert store.get_connection("pg") == {"host": "h"}
        assert [(r["kind"], r.get("key") or r.get("conn_id")) for r in asked] == [
            ("get_variable", "k"),
            ("get_variable", "gone"),
            ("get_connection", "pg"),
        ]
    finally:
        store.close()


def test_a_refused_read_is_an_error_naming_it() -> None:
    store, _ = answering({("get_variable", "k"): {"ok": False, "error": "wrong Fernet key"}})
    try:
        with pytest.raises(ParseRequestError, match="get_variable 'k': wrong Fernet key"):
            store.get_variable("k")
    finally:
        store.close()


def test_the_store_is_read_only_and_records_secrets() -> None:
    store, asked = answering({})
    try:
        with pytest.raises(StoreUnavailableError, match=r"Variable.set\('k'\).*only read"):
            store.set_variable("k", "v", None)
        with pytest.raises(StoreUnavailableError, match=r"Variable.delete\('k'\)"):
            store.delete_variable("k")
        store.mask(["pw", ""])
        assert store.secrets == {"pw"} and asked == []
    finally:
        store.close()


def test_children_do_not_inherit_the_engine_secrets() -> None:
    environ = {
        "PATH": "/bin",
        "SLUICE__CORE__FERNET_KEY": "key",
        "SLUICE__CORE__SQL_ALCHEMY_CONN": "postgresql://u:pw@h/db",
        "SLUICE__CELERY__BROKER_URL": "redis://:longsecret@h",
        "SLUICE__CORE__DAGS_FOLDER": "/dags",
    }
    assert child_environment(environ, ["longsecret"]) == {
        "PATH": "/bin",
        "SLUICE__CORE__DAGS_FOLDER": "/dags",
    }
