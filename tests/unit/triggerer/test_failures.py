"""The failure and restart policy of the trigger runtime: pure functions, no loop."""

from __future__ import annotations

import errno
import logging
import socket
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from engine.states import TriggerKind
from engine.triggerer.failures import (
    RETURNED_EVENT,
    Failure,
    RestartPolicy,
    rebuild,
    report,
)
from engine.triggerer.outbox import TriggerFailed
from shared_stream.exceptions import SharedStreamFenced
from triggers.base import BaseTrigger, TriggerEvent
from triggers.exceptions import TriggerContractError, UpstreamRefused, UpstreamUnavailable
from triggers.temporal import DateTimeTrigger, TimeDeltaTrigger

POLICY = RestartPolicy((1.0, 5.0), healthy_run_s=60.0)


def _streak(reasons: list[str], ran_s: float = 0.0) -> list[Failure]:
    counted: list[Failure] = []
    previous = None
    for reason in reasons:
        previous = POLICY.count(previous, Failure(reason), ran_s=ran_s)
        counted.append(previous)
    return counted


def test_the_backoff_doubles_up_to_its_maximum() -> None:
    assert [f.backoff_s for f in _streak(["x"] * 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_failures_are_numbered_within_their_streak() -> None:
    streak = _streak(["a", "a", "b"])
    assert [(f.in_row, f.repeats) for f in streak] == [(1, False), (2, True), (3, False)]


def test_a_healthy_run_starts_a_new_streak() -> None:
    previous = _streak(["a", "a", "a"])[-1]
    failure = POLICY.count(previous, Failure("a", "tb"), ran_s=60.0)
    assert failure == Failure("a", "tb", in_row=1, repeats=False, backoff_s=1.0)
    assert failure.seen == frozenset()  # a new streak logs its tracebacks again


@pytest.mark.parametrize("backoff", [(-1.0, 5.0), (5.0, 1.0)])
def test_a_backoff_must_be_initial_then_max(backoff: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="restart_backoff_s"):
        RestartPolicy(backoff, healthy_run_s=1.0)


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (Failure.returned(TriggerEvent(1)), RETURNED_EVENT),
        (Failure.returned(None), "run() returned NoneType instead of yielding TriggerEvents"),
        (Failure.not_an_event(42), "yielded int instead of a TriggerEvent"),
        (Failure.bad_dedup_key(b"k"), "dedup_key() returned bytes, not a str or None"),
        (Failure("boom").not_rebuilt(), "could not re-create the trigger to restart it: boom"),
    ],
)
def test_each_failure_says_what_went_wrong(failure: Failure, reason: str) -> None:
    assert failure.reason.startswith(reason)


def test_rebuild_uses_the_class_its_classpath_names_even_a_base() -> None:
    trigger = TimeDeltaTrigger(timedelta(seconds=5))
    fresh = rebuild(trigger)
    assert fresh is not trigger
    assert type(fresh) is DateTimeTrigger  # what it serializes as
    assert fresh.serialize() == trigger.serialize()


def test_rebuild_refuses_a_classpath_outside_the_triggers_mro() -> None:
    class Elsewhere(BaseTrigger):
        def serialize(self) -> tuple[str, dict[str, Any]]:
            return "somewhere.Else", {}

        async def run(self) -> Any:
            yield TriggerEvent(None)

    with pytest.raises(TriggerContractError, match=r"somewhere\.Else"):
        rebuild(Elsewhere())


def test_report_logs_under_the_runtime_and_returns_the_outbox_item(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    failure = Failure("boom", "tb", in_row=2, repeats=True, backoff_s=2.0, seen=frozenset({"boom"}))
    item = report(7, TriggerKind.WATCHER, failure, restart_in_s=2.0)
    assert item == TriggerFailed(7, TriggerKind.WATCHER, "boom", "tb", will_restart=True)
    (record,) = caplog.records
    assert record.name == "engine.triggerer.runtime"
    assert record.__dict__["failures_in_row"] == 2
    assert "tb" not in record.getMessage()  # seen: the traceback was logged before


def test_a_fenced_subscriber_fails_without_a_traceback(caplog) -> None:
    """Its triggerer lost its lease (said once, with the group's end): each of its watchers
    failing with its group says so in a line, without a traceback into shared_stream."""
    caplog.set_level(logging.ERROR, logger="engine.triggerer.runtime")
    try:
        raise SharedStreamFenced("shared stream key=('k',) fenced: no heartbeat for 2.2s")
    except SharedStreamFenced as exc:
        failure = Failure.from_exception(exc)
    report(5, TriggerKind.WATCHER, failure, restart_in_s=1.0)
    (record,) = caplog.records
    assert "SharedStreamFenced" in record.getMessage()
    assert "Traceback" not in record.getMessage()


def test_only_an_unreachable_upstream_is_carried_to_the_store_with_what_and_where() -> None:
    down = Failure.from_exception(UpstreamUnavailable("down", address="mq:5672"))
    named = report(3, TriggerKind.WATCHER, replace(down, broker="rabbitmq"), restart_in_s=1.0)
    assert (named.unreachable_broker, named.unreachable_address) == ("rabbitmq", "mq:5672")
    refused = Failure.from_exception(UpstreamRefused("bad login", address="mq:5672"))
    other = report(3, TriggerKind.WATCHER, replace(refused, broker="rabbitmq"), restart_in_s=1.0)
    assert (other.unreachable_broker, other.unreachable_address) == (None, None)


def _log_streak(errors: list[BaseException], caplog: pytest.LogCaptureFixture) -> list[Any]:
    """Count and report each error of one watcher's streak; the records it logged."""
    caplog.set_level(logging.DEBUG, logger="engine.triggerer.runtime")
    previous = None
    for exc in errors:
        previous = POLICY.count(previous, Failure.from_exception(exc), ran_s=0.5)
        report(3, TriggerKind.WATCHER, previous, restart_in_s=previous.backoff_s, max_backoff_s=5.0)
    return [r for r in caplog.records if r.__dict__.get("action") == "trigger_failed"]


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # to give it a traceback
        return caught


@pytest.mark.parametrize(
    "exc",
    [
        UpstreamUnavailable("the broker is down", address="b1:9092,b2:9092"),
        ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9092)"),
        socket.gaierror(-2, "Name or service not known"),
        TimeoutError(errno.ETIMEDOUT, "Connection timed out"),  # a socket connect's
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        # a producer's task group that ended with its poll's error (SQS, seen by the
        # conformance kit's broker_restart: it used to be an ERROR with its traceback)
        ExceptionGroup(
            "unhandled errors in a TaskGroup", [UpstreamUnavailable("down", address="q")]
        ),
    ],
)
def test_an_unavailable_upstream_is_one_warning_then_debug_lines(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    records = _log_streak([_raised(exc) for _ in range(4)], caplog)
    assert [r.levelname for r in records] == ["WARNING", "DEBUG", "DEBUG", "DEBUG"]
    assert not any("Traceback" in r.getMessage() for r in records)
    warning = records[0]
    assert warning.__dict__["unavailable"] is True
    assert "retrying in 1s" in warning.getMessage()
    assert "up to 5s" in warning.getMessage()
    if isinstance(exc, ExceptionGroup):
        assert warning.__dict__["address"] == "q"
    if isinstance(exc, UpstreamUnavailable):
        assert "cannot reach b1:9092,b2:9092" in warning.getMessage()
        assert warning.__dict__["address"] == "b1:9092,b2:9092"
    assert [r.__dict__["backoff_s"] for r in records] == [1.0, 2.0, 4.0, 5.0]


def test_other_errors_show_each_distinct_traceback_once_per_streak(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = [ValueError("a"), KeyError("b"), ValueError("a"), KeyError("b"), ValueError("a")]
    records = _log_streak([_raised(e) for e in errors], caplog)
    assert [r.levelname for r in records] == ["ERROR"] * 5
    with_traceback = ["Traceback" in r.getMessage() for r in records]
    assert with_traceback == [True, True, False, False, False]


def test_an_unexpected_error_amid_an_outage_still_shows_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = UpstreamUnavailable("down", address="q")
    records = _log_streak([_raised(down), _raised(RuntimeError("bug")), _raised(down)], caplog)
    assert [r.levelname for r in records] == ["WARNING", "ERROR", "DEBUG"]
    assert "Traceback" in records[1].getMessage()


def test_a_deferred_tasks_trigger_that_cannot_reach_its_upstream_is_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="engine.triggerer.runtime")
    failure = Failure.from_exception(_raised(UpstreamUnavailable("down", address="h:1")))
    item = report(4, TriggerKind.TASK, failure)
    assert item.will_restart is False
    (record,) = caplog.records
    assert record.levelname == "ERROR"
    assert "cannot reach h:1" in record.getMessage()
    assert "Traceback" not in record.getMessage()


def test_a_refused_login_is_an_error_with_its_cause_once_per_distinct_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sasl = UpstreamRefused("b:9092: SaslAuthenticationFailed: bad password", address="b:9092")
    tls = UpstreamRefused("b:9092: SSLCertVerificationError: expired", address="b:9092")
    records = _log_streak([_raised(e) for e in (sasl, sasl, tls, sasl, tls)], caplog)
    assert [r.levelname for r in records] == ["ERROR", "DEBUG", "ERROR", "DEBUG", "DEBUG"]
    assert "refused by b:9092" in records[0].getMessage()
    assert "bad password" in records[0].getMessage()
    assert "expired" in records[2].getMessage()
    assert not any("Traceback" in r.getMessage() for r in records)
    assert records[0].__dict__["unavailable"] is False


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError(),  # a trigger's own asyncio.timeout / anyio.fail_after
        ConnectionError("HTTP client: server closed the connection"),
        OSError("an OSError with no errno"),
    ],
)
def test_a_bare_timeout_or_connection_error_of_a_trigger_is_an_error_with_its_traceback(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    records = _log_streak([_raised(exc) for _ in range(3)], caplog)
    assert [r.levelname for r in records] == ["ERROR"] * 3
    assert ["Traceback" in r.getMessage() for r in records] == [True, False, False]
    assert records[0].__dict__["unavailable"] is False
