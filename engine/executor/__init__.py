"""The executors: task instances run as task processes, one per task step.

Owns the local executor's slot manager and claim loop (``local``), which scheduled task
instances a claim admits (``admission``: pools, ``max_active_tasks``), the supervision of one
step (``task_supervisor``: it starts the task process, ``engine.execution.task_runner``, and
sends it the ``TaskSpec`` built by ``task_specs``), the executor's side of the task's request
channel (``task_requests``), running callback requests in callback processes
(``callbacks``), the pre-imported process task steps are forked from (``warm_runner``,
driven by ``warm_process``, both on the shared ``engine.warm``), the pure judgement
of how a step ended (``outcomes``), the task log files (``task_logs``), and the Celery
executor's sender and worker (``celery``). May import: ``engine.jobs`` (the job row and
the wake-up on scheduled rows), ``engine.db``, ``engine.execution`` (the task process's
code and protocol), ``engine.authoring``, ``engine.states`` and the leaf utilities; never
another runtime part.

Import from the modules themselves: this package imports nothing, so that a process that
needs one module (the warm runner) starts without the rest (and without SQLAlchemy).
"""
