"""Task logs: one file per try, ``{folder}/{dag_id}/{run_id}/{task_id}/attempt={n}.log``
(a copy of a mapped task: ``{task_id}/map_index={i}/attempt={n}.log``, as Airflow's layout).

A try that defers appends to the same file each time it resumes; the executor writes a
header line per (re)start and a closing line with the outcome. Everything the task's
process prints (stdout, stderr, Python logging, tracebacks) goes through the executor into
that file. Path components are made filesystem-safe (``safe_component``), so any dag,
run or task id maps to one directory and never escapes the folder.

A log file that cannot be written (full disk, permissions) never costs the task its
outcome: ``TaskLogWriter`` switches to the executor's standard error and the executor still
records the task's state.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from typing import IO, TYPE_CHECKING, Final
from urllib.parse import quote

import anyio.to_thread

from engine.exceptions import SluiceError
from engine.logs import Redactor, StreamRedactor

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

logger = logging.getLogger(__name__)

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
    mapped task (``map_index``).

    Raises ``TaskLogNotFoundError`` when there is none.
    """
    copy = f" map_index {map_index}" if map_index >= 0 else ""
    where = f"task {task_id!r}{copy} of DAG {dag_id!r} run {run_id!r}"
    if try_number is None:
        tries = logged_tries(task_log_folder, dag_id, run_id, task_id, map_index=map_index)
        if not tries:
            raise TaskLogNotFoundError(
                f"no log for {where} under {task_log_folder}: the task has not run yet, or "
                "its logs were written under another [logging] task_log_folder"
            )
        try_number = tries[-1]
    path = log_path(task_log_folder, dag_id, run_id, task_id, try_number, map_index=map_index)
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as exc:
        tries = logged_tries(task_log_folder, dag_id, run_id, task_id, map_index=map_index)
        raise TaskLogNotFoundError(
            f"no log for try {try_number} of {where} ({path}); tries with a log: "
            f"{', '.join(map(str, tries)) or 'none'}"
        ) from exc


class TaskLogWriter:
    """Appends bytes to one task log file from async code, in worker threads.

    The first ``OSError`` (open or write) switches it to ``fallback`` (the executor's
    standard error by default) for the rest of the try; it never raises ``OSError``.
    """

    def __init__(
        self,
        path: Path,
        *,
        fallback: IO[bytes] | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self.path = path
        self._fallback = fallback
        #: the configured secrets never reach the file, whatever the task prints
        self._secrets = list(secrets)
        self._redactor = StreamRedactor(Redactor(self._secrets))
        self._file: IO[bytes] | None = None
        self.failed: OSError | None = None
        self.bytes_written = 0

    def __repr__(self) -> str:
        state = "failed" if self.failed else "open" if self._file else "closed"
        return f"<TaskLogWriter {self.path} {state} bytes={self.bytes_written}>"

    def add_secrets(self, secrets: Iterable[str]) -> None:
        """Mask these too from now on: values the task read (a connection's password, a
        sensitive variable); the executor adds them before the task can print them."""
        new = [s for s in dict.fromkeys(secrets) if s and s not in self._secrets]
        if new:
            self._secrets.extend(new)
            self._redactor.use(Redactor(self._secrets))

    def redact(self, text: str) -> str:
        """``text`` with every secret this try's log masks (the configured ones and those
        the task read so far) as ``***``: for what leaves the log about the try (its error
        in the engine's log, in a callback request)."""
        return self._redactor.redactor.text(text)

    async def write(self, data: bytes) -> None:
        data = self._redactor.feed(data)
        if data:
            await anyio.to_thread.run_sync(self._write, data)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        """Close the file now (also safe where awaiting is not: cleanup after cancellation)."""
        rest = self._redactor.flush()
        if rest:
            self._write(rest)
        self._close()

    def _write(self, data: bytes) -> None:
        if self.failed is None:
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = self.path.open("ab")
                self._file.write(data)
                self._file.flush()
                self.bytes_written += len(data)
                return
            except OSError as exc:
                self._switch_to_fallback(exc)
        self._write_fallback(data)

    def _switch_to_fallback(self, exc: OSError) -> None:
        self.failed = exc
        logger.warning(
            "Cannot write task log %s (%s); writing it to the executor's stderr instead",
            self.path,
            exc,
            extra={"action": "task_log_unwritable", "path": str(self.path)},
        )
        self._close()
        self._write_fallback(
            f"[task log {self.path} unwritable ({exc}); continued here]\n".encode()
        )

    def _write_fallback(self, data: bytes) -> None:
        try:
            if self._fallback is not None:
                self._fallback.write(data)
                self._fallback.flush()
                return
            binary = getattr(sys.stderr, "buffer", None)
            if binary is not None:
                binary.write(data)
                binary.flush()
            else:  # a text-only stderr (e.g. replaced by a test harness)
                sys.stderr.write(data.decode("utf-8", "replace"))
                sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed or full too: nothing left to try
            pass

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError as exc:
                if self.failed is None:
                    self.failed = exc
