"""The warm runner: a pre-imported process that forks task steps (``python -P -m
engine.executor.warm_runner --control-fd N``).

A cold task step pays for a fresh interpreter and for importing the engine's authoring API
and the task runner (most of its start-up). The executor (``engine.executor.warm_process``)
starts this process once: it imports what every task step imports (``PRELOAD``) and,
optionally, the installed packages the DAG files import, then forks one *standby* task
process per request, reparented to the executor. The loop, the safety checks (one thread,
no descriptor opened by a DAG import) and the standby's life are shared with the DAG
processor's parse runner: ``engine.warm.runner`` tells them.

When its step comes, a standby runs ``engine.execution.task_runner.main`` exactly as a cold
``python -m`` start would (``run_task``). The DAG file is imported there, fresh from disk
for every step, so a changed file never runs stale code, and nothing a step does reaches
the warm runner or another step (each is a fresh copy of the warm runner, which never ran a
task). Everything here is stdlib until ``PRELOAD``.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from engine.warm.runner import (
    DAG_FILE_MODULES,
    dag_imports,
    preload,
    prime_operator_arguments,
    serve_main,
    thread_count,
)

__all__ = (
    "OPTIONAL_PRELOAD",
    "PRELOAD",
    "dag_imports",
    "main",
    "preload",
    "run_task",
    "thread_count",
)

#: What every task step imports: the task runner (with what it imports: the protocol, the
#: request channel, loading the DAG file, the context, templates ...), what it imports on
#: first use (logging), and the whole authoring surface a DAG file uses (``from engine
#: import ...``, ``engine.sensors``, the built-in triggers, the broker trigger classes).
#: The broker trigger classes import no broker client (``producers``): a DAG file that
#: declares a watcher then imports nothing in its task steps, while the clients stay out of
#: the warm runner and of every step (a client is imported where its trigger runs, in the
#: triggerer). ``producers`` itself is not listed: each of its names would load, producers
#: and their clients included. Jinja2 and croniter, which the task runner and the DAG files
#: import only when a template renders or a cron expression is read (a cold start of a task
#: that needs neither skips them), are imported here once for all steps.
PRELOAD: Final = (
    "engine.execution.task_runner",
    "engine.execution.process",
    "engine.execution.task_channel",
    "engine.execution.last_good",
    "engine.execution.loading",
    "engine.authoring.dag_files",
    "engine.authoring.store",
    "engine.logs",
    *DAG_FILE_MODULES,
    "jinja2.sandbox",
    "jinja2.nativetypes",
    "jinja2.ext",
)
#: Imported when installed: a running task's dates are pendulum's when it is (its import was
#: three quarters of a warm step's time: ``engine.authoring.context.as_moment``).
OPTIONAL_PRELOAD: Final = ("pendulum",)


def run_task(request: dict[str, Any], channel_fd: int) -> int:
    """In the standby, once its step came: ``python -m engine.execution.task_runner``."""
    from engine.execution import task_runner

    argv = ["--ti-id", str(request["ti_id"]), "--channel-fd", str(channel_fd)]
    sys.argv = [task_runner.__file__, *argv]
    return task_runner.main(argv)


def prime() -> None:
    """Fill, before the forks, what each step would build afresh: the operators' accepted
    arguments and the task process's argument parser."""
    from engine.execution import task_runner

    prime_operator_arguments()
    task_runner.prime()


def main(argv: list[str] | None = None) -> int:
    return serve_main(
        argv,
        prog="python -m engine.executor.warm_runner",
        modules=PRELOAD,
        optional=OPTIONAL_PRELOAD,
        run_step=run_task,
        prime=prime,
    )


if __name__ == "__main__":
    sys.exit(main())
