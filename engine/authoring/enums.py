"""The state and weight enums of ``airflow.sdk``: ``TaskInstanceState``, ``DagRunState`` and
``WeightRule``.

``TaskInstanceState`` and ``DagRunState`` are the states the engine stores
(``engine.states``): compare ``context["ti"].state`` or a run's state with them, and
``ExternalTaskSensor(allowed_states=[TaskInstanceState.SUCCESS])`` takes them. A
``TaskInstanceState`` is a ``str`` (``TaskInstanceState.SUCCESS == "success"``); Sluice's
has ``NONE`` (not yet decided) where Airflow has ``None``, and no ``removed`` /
``up_for_reschedule`` (Sluice has no such states).

``WeightRule`` holds Airflow's values (``downstream``, ``upstream``, ``absolute``) for the
operators' ``weight_rule=``, which Sluice accepts and ignores with a warning (its executors
take tasks in the order they became ready, with no priority weights).
"""

from __future__ import annotations

import enum

from engine.states import DagRunState, TaskState

__all__ = ("DagRunState", "TaskInstanceState", "WeightRule")

#: Airflow's name for a task instance's state
TaskInstanceState = TaskState


class WeightRule(enum.StrEnum):
    """How a task's priority weight is computed (Airflow's values)."""

    DOWNSTREAM = "downstream"
    UPSTREAM = "upstream"
    ABSOLUTE = "absolute"
