"""Log lines: structured fields, JSON format, secrets redacted whatever logged them."""

from __future__ import annotations

import contextvars
import io
import json
import logging
from typing import TYPE_CHECKING

from engine.logs import LOG_FIELDS, Redactor, StreamRedactor, configure_logging

if TYPE_CHECKING:
    from collections.abc import Iterator

import pytest

SECRET = "Zm9vYmFyLXNlY3JldC1rZXktMTIzNDU2Nzg5MGFiY2Q="


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """What the handler ``configure_logging`` installs writes (called inside the test)."""
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def _configure(stream: io.StringIO, fmt: str, secrets: list[str]) -> None:
    configure_logging("INFO", fmt, secrets=secrets)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def test_json_lines_carry_structured_fields_and_never_a_secret(captured: io.StringIO) -> None:
    _configure(captured, "json", [SECRET, "pw-0f-db"])
    log = logging.getLogger("sluice.test")
    log.info(
        "connecting to postgresql://u:pw-0f-db@db/x with key %s",
        SECRET,
        extra={"action": "connect", "trigger_id": 7, "dag_id": "d", "note": f"k={SECRET}"},
    )
    try:
        raise RuntimeError(f"bad token for {SECRET}")
    except RuntimeError:
        log.exception("failed", extra={"task_id": "t", "run_id": "r"})
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert SECRET not in captured.getvalue() and "pw-0f-db" not in captured.getvalue()
    assert lines[0]["message"] == "connecting to postgresql://u:***@db/x with key ***"
    assert (lines[0]["action"], lines[0]["trigger_id"], lines[0]["dag_id"]) == ("connect", 7, "d")
    assert lines[0]["note"] == "k=***"
    assert lines[1]["task_id"] == "t" and lines[1]["run_id"] == "r"
    assert "RuntimeError: bad token for ***" in lines[1]["exc_info"]


def test_text_lines_append_fields_and_redact(captured: io.StringIO) -> None:
    _configure(captured, "text", [SECRET])
    logging.getLogger("sluice.test").warning("key=%s", SECRET, extra={"trigger_id": 3})
    line = captured.getvalue().strip()
    assert line.endswith("key=*** [trigger_id=3]")
    assert SECRET not in line


def test_short_values_are_not_treated_as_secrets(captured: io.StringIO) -> None:
    _configure(captured, "text", ["a"])  # e.g. a one-letter password
    logging.getLogger("sluice.test").warning("a task ran")
    assert "a task ran" in captured.getvalue()


def test_nested_extras_stack_and_url_encoded_forms_are_redacted(captured: io.StringIO) -> None:
    _configure(captured, "json", ["p@ss:word"])
    logging.getLogger("sluice.test").warning(
        "url postgresql://u:p%40ss%3Aword@db/x",
        extra={"conf": {"password": "p@ss:word", "list": ["x p@ss:word"]}},
        stack_info=True,
    )
    assert "p@ss" not in captured.getvalue() and "p%40ss" not in captured.getvalue()
    [line] = [json.loads(x) for x in captured.getvalue().splitlines()]
    assert line["message"] == "url postgresql://u:***@db/x"
    assert line["conf"] == {"password": "***", "list": ["x ***"]}


def test_context_fields_reach_every_line_logged_in_that_context(captured: io.StringIO) -> None:
    _configure(captured, "json", [])
    log = logging.getLogger("sluice.test")

    def in_trigger() -> None:
        LOG_FIELDS.set({"trigger_id": 9, "dag_id": "d", "run_id": "r", "task_id": "t"})
        log.info("from the trigger's own code")
        log.info("explicit wins", extra={"trigger_id": 10})

    contextvars.copy_context().run(in_trigger)
    log.info("outside")
    first, second, outside = (json.loads(x) for x in captured.getvalue().splitlines())
    assert (first["trigger_id"], first["dag_id"], first["run_id"], first["task_id"]) == (
        9, "d", "r", "t"
    )  # fmt: skip
    assert second["trigger_id"] == 10
    assert "trigger_id" not in outside


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_stream_redactor_catches_a_secret_split_across_chunks(chunk: int) -> None:
    stream = StreamRedactor(Redactor([SECRET, "hunter22"]))
    text = f"line one {SECRET}\npartial hunter22 and no newline {SECRET[:5]}".encode()
    out = b"".join(stream.feed(text[i : i + chunk]) for i in range(0, len(text), chunk))
    out += stream.flush()
    assert out == f"line one ***\npartial *** and no newline {SECRET[:5]}".encode()


def test_stream_redactor_passes_complete_lines_at_once() -> None:
    stream = StreamRedactor(Redactor(["hunter22"]))
    assert stream.feed(b"done\nhalf") == b"done\n"
    assert stream.feed(b"\n") == b"half\n"
    assert StreamRedactor(Redactor([])).feed(b"no secrets: as is") == b"no secrets: as is"


def test_broker_libraries_do_not_flood_the_log(captured: io.StringIO) -> None:
    """A broker library's line comes through once per distinct message and window, however
    often it retries; different errors sharing a template are not hidden behind the first."""
    _configure(captured, "text", [])
    kafka = logging.getLogger("aiokafka")
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    for _ in range(20):
        kafka.error('Unable connect to "%s:%s": %s', "127.0.0.1", 9092, "refused")
        kafka.error("Unable connect to node with id %s: %s", 1, "refused")
        coordinator.error("Heartbeat send request failed: %s. Will retry.", "timeout")
    kafka.error('Unable connect to "%s:%s": %s', "127.0.0.1", 9092, "SaslAuthenticationFailed")
    logging.getLogger("sluice.test").error("ours, every time")
    logging.getLogger("sluice.test").error("ours, every time")
    lines = captured.getvalue().splitlines()
    bootstrap = [line for line in lines if "127.0.0.1:9092" in line]
    assert len(bootstrap) == 2 and "SaslAuthenticationFailed" in bootstrap[1]
    assert len([line for line in lines if "node with id" in line]) == 1
    assert len([line for line in lines if "Heartbeat send request failed" in line]) == 1
    assert len([line for line in lines if "ours, every time" in line]) == 2
