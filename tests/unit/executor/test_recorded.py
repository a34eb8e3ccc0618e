"""What a recorded task outcome asks of the other parts (``engine.executor.recording``):
the executor claims what the run's pass scheduled; the scheduler loops only when the pass
left work for it."""

from __future__ import annotations

import pytest

from engine.advancing.advance import Advanced
from engine.executor.outcomes import Decision
from engine.executor.recording import Recorded

SETTLED = Advanced(scheduled=1, decided=False, ended=False)


@pytest.mark.parametrize(
    ("recorded", "needed"),
    [
        (Recorded(Decision.SUCCEED, SETTLED), False),  # the pass decided the run's next tasks
        (Recorded(Decision.FAIL, Advanced(0, decided=False, ended=False)), False),
        (Recorded(Decision.SUCCEED, None), True),  # no pass (off, or the run was held)
        (Recorded(Decision.SUCCEED, Advanced(0, decided=False, ended=True)), True),  # run ended
        (Recorded(Decision.SKIP, Advanced(0, decided=True, ended=False)), True),  # another pass
        (Recorded(Decision.SUCCEED, SETTLED, outlet_events=True), True),  # asset events
        (Recorded(Decision.RETRY), True),
        (Recorded(Decision.REQUEUE), True),
        (Recorded(Decision.DEFER), False),  # a deferral readies no other task
    ],
)
def test_the_scheduler_loops_only_for_what_the_pass_left(recorded: Recorded, needed: bool) -> None:
    assert recorded.scheduler_needed is needed


def test_what_the_pass_scheduled_is_the_executor_s_to_claim() -> None:
    assert Recorded(Decision.SUCCEED, SETTLED).scheduled == 1
    assert Recorded(Decision.SUCCEED, None).scheduled == 0


@pytest.mark.parametrize(
    ("recorded", "needed"),
    [
        (Recorded(Decision.DEFER), True),  # the deferral's trigger row
        (Recorded(Decision.SUCCEED, Advanced(0, decided=False, ended=False, deferred=1)), True),
        (Recorded(Decision.SUCCEED, SETTLED), False),  # nothing for a triggerer
        (Recorded(Decision.FAIL, None), False),
        (Recorded(Decision.RETRY), False),
    ],
)
def test_the_triggerer_is_woken_only_for_a_trigger_row(recorded: Recorded, needed: bool) -> None:
    assert recorded.triggerer_needed is needed
