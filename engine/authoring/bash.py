"""``BashOperator`` and ``@task.bash``: a bash command run by the task (Airflow's).

::

    BashOperator(task_id="export", bash_command="./export.sh {{ ds }} {{ params.limit }}")

    @task.bash(cwd="/data")
    def archive(ds=None) -> str:
        return f"tar czf {ds}.tgz {ds}/"  # the returned command is rendered too

Theory of operation. The command is a template (``bash_command``, ``env`` and ``cwd`` are
``template_fields``; a command ending with ``.sh`` or ``.bash`` names a template file next
to the DAG file: ``engine.execution.templates``). The task process runs ``bash -c
<command>`` as its own subprocess, in the task's process group (so the executor's stop of
the task stops the command too), with standard input from ``/dev/null``; the command's
standard output and error are streamed line by line to the task log. Exit code 0 succeeds
and the task's result is the last line of output; an exit code in ``skip_on_exit_code`` (99
by default) skips the task (``AirflowSkipException``); any other fails it, naming the
code. A task that is interrupted (its ``execution_timeout``) stops the command first.

The command runs in ``cwd`` (which must exist), else in a fresh temporary directory
removed afterwards (as Airflow). Its environment is the task process's (``env=None``), or
``env`` alone, or the task process's updated with ``env`` (``append_env=True``); Airflow's
context variables are added (``AIRFLOW_CTX_DAG_ID``, ``AIRFLOW_CTX_TASK_ID``,
``AIRFLOW_CTX_DAG_RUN_ID``, ``AIRFLOW_CTX_TRY_NUMBER``, ``AIRFLOW_CTX_LOGICAL_DATE``,
``AIRFLOW_CTX_DAG_OWNER``) so ported scripts that read them keep working.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, overload

from engine.authoring.baseoperator import BaseOperator
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.operators import PythonOperator, TaskFactory
from engine.authoring.xcom import XComArg, iter_references
from engine.exceptions import AirflowException, AirflowSkipException

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.authoring.context import Context, RendersTemplates

__all__ = ("BashOperator", "BashTaskFactory", "BashTaskOperator", "CommandResult", "bash_task")

logger = logging.getLogger(__name__)

DEFAULT_SKIP_EXIT_CODE: Final = 99
#: how long a command gets to exit after SIGTERM when its task is interrupted
STOP_GRACE_S: Final = 2.0
BASH_TEMPLATE_EXT: Final = (".sh", ".bash")


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended: its exit code and its last line of output."""

    exit_code: int
    output: str


def run_command(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str, output_encoding: str
) -> CommandResult:
    """Run ``argv``, logging each line of its output (stdout and stderr); the command is
    stopped (SIGTERM, then SIGKILL) when this is interrupted (a timeout, an error)."""
    logger.info("Running command: %s", list(argv), extra={"action": "bash_start"})
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=dict(env),
    )
    line = ""
    try:
        assert process.stdout is not None
        logger.info("Output:", extra={"action": "bash_start"})
        for raw in iter(process.stdout.readline, b""):
            line = raw.decode(output_encoding, errors="backslashreplace").rstrip()
            logger.info("%s", line, extra={"action": "bash_output"})
        exit_code = process.wait()
    finally:
        if process.poll() is None:
            _stop(process)
        if process.stdout is not None:
            process.stdout.close()
    logger.info(
        "Command exited with return code %s",
        exit_code,
        extra={"action": "bash_exit", "exit_code": exit_code},
    )
    return CommandResult(exit_code, line)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _exit_codes(where: str, value: object) -> frozenset[int]:
    if value is None:
        return frozenset()
    codes = [value] if isinstance(value, int) else value
    if not isinstance(codes, Container) or isinstance(codes, str | bytes | Mapping):
        raise DagDefinitionError(f"{where}: skip_on_exit_code must be an int or a list of them")
    items = list(codes)  # type: ignore[call-overload]  # any iterable container
    if not all(isinstance(code, int) and not isinstance(code, bool) for code in items):
        raise DagDefinitionError(
            f"{where}: skip_on_exit_code must be an int or a list of ints, got {value!r}"
        )
    return frozenset(items)


def context_variables(context: Mapping[str, Any], task: BaseOperator) -> dict[str, str]:
    """Airflow's ``AIRFLOW_CTX_*`` variables for a command's environment."""
    ti = context.get("ti")
    dag_run = context.get("dag_run")
    logical_date = context.get("logical_date")
    values = {
        "AIRFLOW_CTX_DAG_OWNER": task.owner,
        "AIRFLOW_CTX_DAG_ID": getattr(task.dag, "dag_id", None) or context.get("dag_id"),
        "AIRFLOW_CTX_TASK_ID": task.task_id,
        "AIRFLOW_CTX_LOGICAL_DATE": None if logical_date is None else logical_date.isoformat(),
        "AIRFLOW_CTX_TRY_NUMBER": getattr(ti, "try_number", context.get("try_number")),
        "AIRFLOW_CTX_DAG_RUN_ID": getattr(dag_run, "run_id", None) or context.get("run_id"),
    }
    return {name: str(value) for name, value in values.items() if value is not None}


class _RunsBash:
    """What ``BashOperator`` and ``@task.bash`` share: the options and running the command."""

    task_id: str
    env: Mapping[str, str] | None
    cwd: str | None

    def _set_bash_options(
        self,
        where: str,
        *,
        env: Mapping[str, str] | None,
        append_env: bool,
        output_encoding: str,
        skip_on_exit_code: int | Container[int] | None,
        cwd: str | None,
        output_processor: Callable[[str], Any] | None,
    ) -> None:
        if env is not None and not isinstance(env, Mapping | XComArg):
            raise DagDefinitionError(f"{where}: env must be a dict of str, got {env!r}")
        if cwd is not None and not isinstance(cwd, str | os.PathLike | XComArg):
            raise DagDefinitionError(f"{where}: cwd must be a str, got {cwd!r}")
        if output_processor is not None and not callable(output_processor):
            raise DagDefinitionError(f"{where}: output_processor must be callable")
        self.env = env
        self.append_env = bool(append_env)
        self.output_encoding = output_encoding
        self.skip_on_exit_code = _exit_codes(where, skip_on_exit_code)
        self.cwd = None if cwd is None else os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd
        self.output_processor = output_processor

    def _environment(self, context: Mapping[str, Any]) -> dict[str, str]:
        env = self.env
        if env is not None and not isinstance(env, Mapping):
            raise AirflowException(f"task {self.task_id!r}: env must be a dict, got {env!r}")
        bad = [key for key, value in (env or {}).items() if not isinstance(value, str)]
        if bad or not all(isinstance(key, str) for key in env or {}):
            raise AirflowException(
                f"task {self.task_id!r}: env names and values must be str; "
                f"not so for {bad or list(env or {})!r}"
            )
        if env is None:
            result = dict(os.environ)
        elif self.append_env:
            result = {**os.environ, **env}
        else:
            result = dict(env)
        assert isinstance(self, BaseOperator)
        result.update(context_variables(context, self))
        return result

    def _check_cwd(self) -> None:
        if self.cwd is None:
            return
        if not isinstance(self.cwd, str):
            raise AirflowException(f"task {self.task_id!r}: cwd must be a str, got {self.cwd!r}")
        if not os.path.exists(self.cwd):
            raise AirflowException(f"task {self.task_id!r}: cannot find the cwd {self.cwd!r}")
        if not os.path.isdir(self.cwd):
            raise AirflowException(
                f"task {self.task_id!r}: the cwd {self.cwd!r} must be a directory"
            )

    def run_bash(self, command: object, context: Mapping[str, Any]) -> Any:
        """Run ``command`` (already rendered) with bash; its last line, or skip, or fail."""
        if not isinstance(command, str) or not command.strip():
            raise AirflowException(
                f"task {self.task_id!r}: the bash command must be a non-empty str, got {command!r}"
            )
        self._check_cwd()
        env = self._environment(context)
        argv = [shutil.which("bash") or "bash", "-c", command]
        with contextlib.ExitStack() as stack:
            cwd = self.cwd or stack.enter_context(tempfile.TemporaryDirectory(prefix="sluicetmp"))
            result = run_command(argv, env=env, cwd=cwd, output_encoding=self.output_encoding)
        if result.exit_code in self.skip_on_exit_code:
            raise AirflowSkipException(
                f"Bash command returned exit code {result.exit_code}. Skipping."
            )
        if result.exit_code != 0:
            raise AirflowException(
                "Bash command failed. The command returned a non-zero exit code "
                f"{result.exit_code}."
            )
        output = result.output
        return output if self.output_processor is None else self.output_processor(output)


class BashOperator(_RunsBash, BaseOperator):
    """Runs ``bash_command`` with bash; the result is its last line of output.

    Airflow's arguments: ``env`` (None: the task process's environment), ``append_env``
    (``env`` on top of it), ``cwd`` (default: a temporary directory), ``skip_on_exit_code``
    (an int or ints: these exit codes skip the task; 99 by default), ``output_encoding``,
    ``output_processor`` (applied to the last line). ``bash_command``, ``env`` and ``cwd``
    are templates; a command ending in ``.sh`` / ``.bash`` is a template file next to the
    DAG file (end it with a space to run such a script as it is).
    """

    template_fields: Sequence[str] = ("bash_command", "env", "cwd")
    template_ext: Sequence[str] = BASH_TEMPLATE_EXT

    def __init__(
        self,
        *,
        bash_command: str,
        env: Mapping[str, str] | None = None,
        append_env: bool = False,
        output_encoding: str = "utf-8",
        skip_on_exit_code: int | Container[int] | None = DEFAULT_SKIP_EXIT_CODE,
        cwd: str | None = None,
        output_processor: Callable[[str], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        if not isinstance(bash_command, str | XComArg) or not str(bash_command).strip():
            raise DagDefinitionError(
                f"{where}: bash_command must be a non-empty str, got {bash_command!r}"
            )
        super().__init__(**kwargs)
        self.bash_command: Any = bash_command
        self._set_bash_options(
            where,
            env=env,
            append_env=append_env,
            output_encoding=output_encoding,
            skip_on_exit_code=skip_on_exit_code,
            cwd=cwd,
            output_processor=output_processor,
        )
        for reference in iter_references([bash_command, env, cwd]):
            self.set_upstream(reference)

    def execute(self, context: Context) -> Any:
        return self.run_bash(self.bash_command, context)


class BashTaskOperator(_RunsBash, PythonOperator):
    """What ``@task.bash`` adds: the function returns the command (a non-empty str), which
    is rendered as a template and run like ``BashOperator``'s."""

    template_fields: Sequence[str] = (*PythonOperator.template_fields, "bash_command", "env", "cwd")
    template_ext: Sequence[str] = BASH_TEMPLATE_EXT

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        env: Mapping[str, str] | None = None,
        append_env: bool = False,
        output_encoding: str = "utf-8",
        skip_on_exit_code: int | Container[int] | None = DEFAULT_SKIP_EXIT_CODE,
        cwd: str | None = None,
        output_processor: Callable[[str], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        super().__init__(python_callable=python_callable, **kwargs)
        self.bash_command: str | None = None
        self._set_bash_options(
            where,
            env=env,
            append_env=append_env,
            output_encoding=output_encoding,
            skip_on_exit_code=skip_on_exit_code,
            cwd=cwd,
            output_processor=output_processor,
        )
        for reference in iter_references([env, cwd]):
            self.set_upstream(reference)

    def execute(self, context: Context) -> Any:
        command = super().execute(context)
        if not isinstance(command, str) or not command.strip():
            raise TypeError(
                f"task {self.task_id!r}: a @task.bash function returns the command to run, a "
                f"non-empty str; it returned {command!r}"
            )
        ti: RendersTemplates = context["ti"]  # the task process renders it, as the fields
        self.bash_command = ti.render_template(command, context, template_ext=self.template_ext)
        return self.run_bash(self.bash_command, context)


class BashTaskFactory(TaskFactory):
    """What ``@task.bash`` returns: each call adds a ``BashTaskOperator``."""

    operator_class = BashTaskOperator

    def __repr__(self) -> str:
        return f"<@task.bash {getattr(self.function, '__qualname__', self.function)!r}>"


@overload
def bash_task(python_callable: Callable[..., Any], /) -> BashTaskFactory: ...


@overload
def bash_task(**operator_kwargs: Any) -> Callable[[Callable[..., Any]], BashTaskFactory]: ...


def bash_task(
    python_callable: Callable[..., Any] | None = None,
    /,
    **operator_kwargs: Any,
) -> BashTaskFactory | Callable[[Callable[..., Any]], BashTaskFactory]:
    """``@task.bash`` / ``@task.bash(env=..., cwd=..., skip_on_exit_code=...)``: the function
    (its parameters filled as ``@task``'s) returns the bash command to run."""
    if python_callable is not None:
        return BashTaskFactory(python_callable, **operator_kwargs)
    return functools.partial(BashTaskFactory, **operator_kwargs)
