"""The local executor: task instances run as child processes, one per task step.

Owns the slot manager and claim loop (``local``), the supervision of one step
(``task_supervisor``), the child process (``task_runner``), the pure judgement of how a step
ended (``outcomes``) and the task log files (``task_logs``). May import: ``engine.db``,
``engine.authoring`` and the leaf utilities; never another runtime part.
"""

from __future__ import annotations

from engine.executor.local import LocalExecutor
from engine.executor.task_supervisor import ExecutorSettings

__all__: tuple[str, ...] = ("ExecutorSettings", "LocalExecutor")
