"""The Celery executor: task tries run on ``sluice celery worker`` processes, fed through a
Celery broker (Redis or RabbitMQ), with the same task supervisor as the local executor.

- ``app``: the Celery application and the settings crash-safe delivery needs;
- ``sender``: the executor part of ``sluice run`` / ``sluice executor`` with ``[executor]
  kind = "celery"``: claims scheduled tries and sends one message per try to its queue;
- ``worker``: what runs inside a Celery worker: takes over the try a message names (the
  metadata DB decides whether it still means work) and runs it with
  ``engine.executor.task_supervisor.TaskSupervisor``.

Import from the modules themselves (as for ``engine.executor``): this package imports
nothing, so the local executor never loads Celery.
"""
