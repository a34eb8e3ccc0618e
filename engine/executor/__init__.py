"""The local executor: task instances run as child processes, one per task step.

Owns the slot manager and claim loop (``local``), which scheduled task instances a claim
admits (``admission``: pools, ``max_active_tasks``), the supervision of one step
(``task_supervisor``), the child process (``task_runner``), the pre-imported process task
steps are forked from (``warm_runner``, driven by ``warm_process``; the forked processes:
``forked_process``), the pure judgement of
how a step ended (``outcomes``) and the task log files (``task_logs``). May import: ``engine.db``,
``engine.authoring`` and the leaf utilities; never another runtime part.

Import from the modules themselves: this package imports nothing, so that a child
process that needs one module (the task runner, the DAG file parser) starts without the
rest (and without SQLAlchemy).
"""
