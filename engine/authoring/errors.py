"""The errors of the authoring API: a DAG file that declares something invalid, a deferred
task that cannot resume, a sensor that timed out (Airflow's exceptions are
``engine.exceptions``)."""

from __future__ import annotations

from engine.exceptions import AirflowException, AirflowSensorTimeout, DagFileError


class DagDefinitionError(DagFileError, ValueError):
    """A DAG file declares something invalid; the message names the file, line and object.

    ``lineno`` is the line in the DAG file when the error was found after the import
    (e.g. two DAGs with one id); otherwise the line comes from the traceback.
    """

    def __init__(self, message: str, *, lineno: int | None = None) -> None:
        super().__init__(message)
        self.lineno = lineno


class TaskDeferralError(AirflowException):
    """A deferred task cannot resume: its trigger failed (``next_method == "__fail__"``)."""


class TaskDeferralTimeout(TaskDeferralError):
    """A deferred task waited longer than the ``timeout`` given to ``defer``."""


class SensorTimeout(AirflowSensorTimeout):
    """A sensor in poke mode did not succeed within its ``timeout`` (``AirflowSensorTimeout``)."""
