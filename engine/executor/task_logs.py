"""Task logs: writing one file per try (the layout, and reading it back, are in
``engine.task_log_files``, re-exported here).

A try that defers appends to the same file each time it resumes; the executor writes a
header line per (re)start and a closing line with the outcome. Everything the task's
process prints (stdout, stderr, Python logging, tracebacks) goes through the executor into
that file.

A log file that cannot be written (full disk, permissions) never costs the task its
outcome: ``TaskLogWriter`` switches to the executor's standard error and the executor still
records the task's state.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, TYPE_CHECKING

import anyio.to_thread

from engine.logs import Redactor, StreamRedactor
from engine.task_log_files import LOG_FILE_PREFIX as LOG_FILE_PREFIX
from engine.task_log_files import LOG_FILE_SUFFIX as LOG_FILE_SUFFIX
from engine.task_log_files import MAX_COMPONENT_CHARS as MAX_COMPONENT_CHARS
from engine.task_log_files import TaskLogNotFoundError as TaskLogNotFoundError
from engine.task_log_files import log_path as log_path
from engine.task_log_files import logged_tries as logged_tries
from engine.task_log_files import read_task_log as read_task_log
from engine.task_log_files import safe_component as safe_component
from engine.task_log_files import task_log_dir as task_log_dir

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

logger = logging.getLogger(__name__)


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
