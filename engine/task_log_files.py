"""Where task logs live: one file per try, ``{folder}/{dag_id}/{run_id}/{task_id}/attempt={n}.log``
(a copy of a mapped task: ``{task_id}/map_index={i}/attempt={n}.log``, as Airflow's layout).

The executor writes these files (``engine.executor.task_logs``); the CLI, the REST API and
the web UI read them. Path components are made filesystem-safe (``safe_component``), so any
dag, run or task id maps to one directory and never escapes the folder; ``resolve_inside``
checks that a path, once symbolic links are followed, is still inside the folder.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

from engine.exceptions import SluiceError

if TYPE_CHECKING:
    from pathlib import Path

LOG_FILE_PREFIX: Final = "attempt="
LOG_FILE_SUFFIX: Final = ".log"
MAX_COMPONENT_CHARS: Final = 200
_SAFE_CHARS: Final = "-_.+=@,"
_LOG_FILE_RE: Final = re.compile(r"^attempt=(\d+)\.log$")


class TaskLogNotFoundError(SluiceError, FileNotFoundError):
    """No log exists for the task (or the requested try): it has not run yet, or ran under
    another ``[logging] task_log_folder``."""


def safe_component(text: str) -> str:
    """``text`` as one safe path component: percent-encoded, never ``.``/``..``, bounded.

    Distinct ids give distinct components (long ones keep a digest of the full text).
    """
    safe = quote(text, safe=_SAFE_CHARS)
    if safe in ("", ".", ".."):
        safe = "%2E" * len(safe) or "%"  # quote() never yields a lone "%"
    if len(safe) > MAX_COMPONENT_CHARS:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        safe = f"{safe[: MAX_COMPONENT_CHARS - 17]}~{digest}"
    return safe


def task_log_dir(
    folder: Path, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
) -> Path:
    """The directory holding every try's log of one task instance (``map_index`` >= 0: of
    one copy of a mapped task)."""
    path = folder / safe_component(dag_id) / safe_component(run_id) / safe_component(task_id)
    return path / f"map_index={int(map_index)}" if map_index >= 0 else path


def log_path(
    folder: Path, dag_id: str, run_id: str, task_id: str, try_number: int, *, map_index: int = -1
) -> Path:
    """The log file of one try."""
    name = f"{LOG_FILE_PREFIX}{int(try_number)}{LOG_FILE_SUFFIX}"
    return task_log_dir(folder, dag_id, run_id, task_id, map_index=map_index) / name


def logged_tries(
    folder: Path, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
) -> list[int]:
    """The try numbers that have a log file, ascending."""
    directory = task_log_dir(folder, dag_id, run_id, task_id, map_index=map_index)
    try:
        names = [entry.name for entry in directory.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for name in names if (m := _LOG_FILE_RE.match(name)))


def find_log_file(
    task_log_folder: Path,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int | None = None,
    *,
    map_index: int = -1,
) -> tuple[Path, int, list[int]]:
    """(the log file of one try, that try, the tries with a log) of a task or of one copy
    of a mapped task (``map_index``); the latest try by default.

    Raises ``TaskLogNotFoundError`` when there is none (``LogPathOutsideFolderError`` for a
    path that leads out of the folder, through a symbolic link).
    """
    copy = f" map_index {map_index}" if map_index >= 0 else ""
    where = f"task {task_id!r}{copy} of DAG {dag_id!r} run {run_id!r}"
    tries = logged_tries(task_log_folder, dag_id, run_id, task_id, map_index=map_index)
    if try_number is None:
        if not tries:
            raise TaskLogNotFoundError(
                f"no log for {where} under {task_log_folder}: the task has not run yet, or "
                "its logs were written under another [logging] task_log_folder"
            )
        try_number = tries[-1]
    path = log_path(task_log_folder, dag_id, run_id, task_id, try_number, map_index=map_index)
    inside = resolve_inside(task_log_folder, path)
    if not inside.is_file():
        raise TaskLogNotFoundError(
            f"no log for try {try_number} of {where} ({path}); tries with a log: "
            f"{', '.join(map(str, tries)) or 'none'}"
        )
    return inside, try_number, tries


def read_task_log(
    task_log_folder: Path,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int | None = None,
    *,
    map_index: int = -1,
) -> str:
    """The text of one try's log (the latest try by default) of a task or of one copy of a
    mapped task (``map_index``). Raises as ``find_log_file`` does."""
    path, _, _ = find_log_file(
        task_log_folder, dag_id, run_id, task_id, try_number, map_index=map_index
    )
    return path.read_text(encoding="utf-8", errors="replace")


class LogPathOutsideFolderError(TaskLogNotFoundError):
    """A log path that would leave the task log folder (a symbolic link pointing out of it,
    or a path built by hand): refused, and reported as no log at all."""


def resolve_inside(folder: Path, path: Path) -> Path:
    """``path`` with symbolic links resolved, if it is inside ``folder`` (resolved too);
    raises ``LogPathOutsideFolderError`` otherwise."""
    root = folder.resolve()
    resolved = path.resolve()
    if resolved != root and not resolved.is_relative_to(root):
        raise LogPathOutsideFolderError(f"no log at {path}: it is not inside {folder}")
    return resolved
