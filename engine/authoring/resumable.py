"""``ResumableJobMixin``: an operator that submits one long-running job to an external
system and polls it, made crash-safe through the task state store (Airflow 3.3's).

Theory of operation. ``execute_resumable(context)`` runs the job: it submits it
(``submit_job``), stores the external id the submit returned in the task instance's state
store *before* it starts polling (``poll_until_complete``), and returns
``get_job_result``. When a try dies while the job runs (the worker killed, the host
preempted, a timeout), the next try of the same task instance finds the stored id and asks
the external system for the job's status (``get_job_status``):

- still active (``is_job_active``): it reconnects, polling the job that runs instead of
  submitting a duplicate;
- succeeded (``is_job_succeeded``): it returns the job's result without polling;
- ended otherwise (failed, cancelled, unknown): it submits a new job, whose id replaces the
  stored one.

``submit_job`` may return None when the external system gives no id to track: then nothing
is stored and every try submits again. ``poll_until_complete`` blocks until the job ends
and raises if it did not succeed (the try fails, and a retry resumes as above). The stored
id is kept after success (for observability), under ``RESUMABLE_JOB_KEY``, with the
deployment's default retention, unless ``resumable_job_retention`` says otherwise.

This is not a deferrable operator: the worker slot stays taken while polling.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import timedelta

    from engine.authoring.state_store import TaskStateStore, _NeverExpire

__all__ = ("RESUMABLE_JOB_KEY", "ResumableJobMixin")

logger = logging.getLogger(__name__)

#: the task state store key the external id is stored under
RESUMABLE_JOB_KEY: Final = "resumable_job_id"


class ResumableJobMixin:
    """Mix into an operator and call ``self.execute_resumable(context)`` from ``execute``;
    implement the six methods below for the external system."""

    #: how long the stored id is kept (None: ``[state_store] default_retention_days``)
    resumable_job_retention: ClassVar[timedelta | _NeverExpire | None] = None

    # --- what a subclass implements -----------------------------------------------------

    def submit_job(self, context: Mapping[str, Any]) -> Any:
        """Submit the job; its external id (JSON), or None if it has none to track."""
        raise NotImplementedError(f"{type(self).__name__} must implement submit_job")

    def get_job_status(self, external_id: Any, context: Mapping[str, Any]) -> str:
        """The job's current status, as the external system names it."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_job_status")

    def is_job_active(self, status: str) -> bool:
        """Whether a job in ``status`` is still queued or running."""
        raise NotImplementedError(f"{type(self).__name__} must implement is_job_active")

    def is_job_succeeded(self, status: str) -> bool:
        """Whether a job in ``status`` ended well."""
        raise NotImplementedError(f"{type(self).__name__} must implement is_job_succeeded")

    def poll_until_complete(self, external_id: Any, context: Mapping[str, Any]) -> None:
        """Block until the job ended; raise if it did not succeed."""
        raise NotImplementedError(f"{type(self).__name__} must implement poll_until_complete")

    def get_job_result(self, external_id: Any, context: Mapping[str, Any]) -> Any:
        """What the task returns once the job succeeded (its XCom)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_job_result")

    # --- the flow -------------------------------------------------------------------------

    def execute_resumable(self, context: Mapping[str, Any]) -> Any:
        """Reconnect to the job an earlier try submitted, or submit one; its result."""
        store = _task_state_store(context)
        stored = store.get(RESUMABLE_JOB_KEY)
        if stored is not None:
            status = self.get_job_status(stored, context)
            if self.is_job_active(status):
                logger.info("Reconnecting to job %s (status %s)", stored, status)
                return self._complete(stored, context)
            if self.is_job_succeeded(status):
                logger.info("Job %s already succeeded (status %s)", stored, status)
                return self.get_job_result(stored, context)
            logger.info("Job %s ended with status %s; submitting a new one", stored, status)
        external_id = self.submit_job(context)
        if external_id is None:
            logger.warning("The job has no id to track: a retry will submit it again")
            store.delete(RESUMABLE_JOB_KEY)
        else:
            store.set(RESUMABLE_JOB_KEY, external_id, retention=self.resumable_job_retention)
            logger.info("Submitted job %s", external_id)
        return self._complete(external_id, context)

    def _complete(self, external_id: Any, context: Mapping[str, Any]) -> Any:
        self.poll_until_complete(external_id, context)
        return self.get_job_result(external_id, context)


def _task_state_store(context: Mapping[str, Any]) -> TaskStateStore:
    store = context.get("task_state_store")
    if store is None:
        raise AirflowException(
            "execute_resumable needs the context of a running task (its task_state_store)"
        )
    return store  # type: ignore[no-any-return]
