"""The Celery application of the Celery executor and the settings its delivery relies on.

Theory of operation. One message per try: ``RUN_TRY_TASK(ti_id, sender_job_id)``, sent to
the try's queue. The metadata DB, not Celery, holds the try's state and result: a message is
only a hint that a try may be waiting, and the worker checks that in the DB before it runs
anything (``engine.db.queries.celery.take_over_queued``). That makes every delivery
guarantee Celery gives "at least once" enough:

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only once
  its try ended; a worker killed mid-try (SIGKILL, OOM) leaves it unacknowledged, and the
  broker hands it out again (RabbitMQ at once, when the connection drops; Redis after
  ``visibility_timeout``). The redelivery finds the try held by the dead worker and is
  dropped; the try itself is recovered from the DB like any dead executor's
  (``engine.scheduler.orphans.recover_orphaned_tasks``): it counts as a failed try,
  ``up_for_retry`` (then sent again as the next try) while the task has retries left, else
  ``failed``.
- ``task_acks_on_failure_or_timeout``: a task that raised is acknowledged (the try's failure
  is already recorded in the DB; a redelivery would only be dropped).
- ``worker_prefetch_multiplier = 1``: a worker reserves one message per free slot, so a
  message never waits behind a long try on a busy worker while another worker idles.
- durable queues, persistent messages (Celery's defaults on RabbitMQ) survive a broker
  restart; a message lost anyway (Redis keeps nothing on disk here) is sent again when its
  try has been ``queued`` for ``task_queued_timeout``.
- no result backend unless configured: nothing reads Celery's results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from celery import Celery

if TYPE_CHECKING:
    from engine.config import CeleryConfig

RUN_TRY_TASK: Final = "sluice.run_try"


def celery_app(config: CeleryConfig, *, name: str = "sluice") -> Celery:
    """A Celery app on ``config``'s broker, configured for crash-safe delivery."""
    app = Celery(name, broker=config.broker_url, backend=config.result_backend or None)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        task_ignore_result=not config.result_backend,
        task_default_queue=config.default_queue,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        # Our own logging stays in charge (engine.logs); Celery logs through it.
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        # A try goes on after a lost broker connection: its outcome is written to the DB,
        # the one place that decides; its redelivered message is then dropped.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": config.visibility_timeout},
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
    )
    return app
