"""Airflow's sensor arguments: soft_fail, silent_fail, mode, never_fail."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from engine import BaseSensorOperator, DagDefinitionError
from engine.authoring.arguments import forget_warnings
from engine.authoring.context import DEFAULT_DEFERRABLE_KEY
from engine.authoring.deferral import FAIL_METHOD
from engine.authoring.errors import SensorTimeout
from engine.exceptions import AirflowFailException, AirflowSkipException


@pytest.fixture(autouse=True)
def _fresh_warnings():
    forget_warnings()
    yield
    forget_warnings()


class ScriptedSensor(BaseSensorOperator):
    """Pokes by running a script of outcomes (True, False or an exception); fake clock."""

    def __init__(self, *, script: list[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script = list(script)
        self.now_s = 0.0

    def poke(self, context: dict[str, Any]) -> bool:
        outcome = self.script.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return bool(outcome)

    def _monotonic(self) -> float:
        return self.now_s

    def _sleep(self, seconds: float) -> None:
        self.now_s += seconds


POKING = {DEFAULT_DEFERRABLE_KEY: False}


def test_soft_fail_turns_a_timeout_into_a_skip() -> None:
    hard = ScriptedSensor(task_id="hard", script=[False, False], poke_interval=5, timeout=5)
    with pytest.raises(SensorTimeout):
        hard.execute(POKING)
    soft = ScriptedSensor(
        task_id="soft", script=[False, False], poke_interval=5, timeout=5, soft_fail=True
    )
    with pytest.raises(AirflowSkipException, match="'soft' timed out"):
        soft.execute(POKING)


def test_soft_fail_also_covers_a_deferral_that_timed_out() -> None:
    soft = ScriptedSensor(task_id="soft", script=[], soft_fail=True)
    with pytest.raises(AirflowSkipException):
        soft.resume_execution(FAIL_METHOD, {"error": "trigger timeout"}, {})


def test_silent_fail_logs_a_poke_error_and_pokes_again(caplog) -> None:
    loud = ScriptedSensor(task_id="loud", script=[OSError("disk")])
    with pytest.raises(OSError, match="disk"):
        loud.execute(POKING)
    quiet = ScriptedSensor(
        task_id="quiet", script=[OSError("disk"), True], poke_interval=1, silent_fail=True
    )
    with caplog.at_level(logging.ERROR, logger="engine.authoring.sensors"):
        assert quiet.execute(POKING) is None
    assert [r.action for r in caplog.records] == ["poke_failed"]
    deliberate = ScriptedSensor(task_id="d", script=[AirflowFailException("no")], silent_fail=True)
    with pytest.raises(AirflowFailException):
        deliberate.execute(POKING)


def test_mode_must_be_poke_or_reschedule() -> None:
    with pytest.raises(DagDefinitionError, match="mode must be one of"):
        ScriptedSensor(task_id="c", script=[], mode="sleep")


def test_soft_fail_and_never_fail_are_exclusive() -> None:
    with pytest.raises(DagDefinitionError, match="mutually exclusive"):
        ScriptedSensor(task_id="c", script=[], soft_fail=True, never_fail=True)
