"""The DAG processor: parses the dags folder in child processes and syncs the metadata DB.

Each ``.py`` file is imported by its own child (``python -P -m
engine.dag_processing.parsing``), at most ``parsing_processes`` at a time. A child that runs
longer than ``[core] dag_file_processor_timeout`` is killed with its whole process group; a
little before that it dumps its stack, so the stored error points at the line that hung. The
results of one pass are applied in one transaction (``engine.dag_processing.sync``).

``run()`` parses everything, reports ready, then re-parses the files that change (watchfiles;
a change in the plugins folder re-parses everything) and everything again every
``[scheduler] dag_dir_list_interval`` seconds as a safety net. ``parse_once()`` does one full
pass (tests, CLI).
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import watchfiles

from engine.dag_processing.parse_requests import ParseRequestServer
from engine.dag_processing.parsing import FileParseResult, ParseError
from engine.dag_processing.planning import ASSET_CONFLICT, DUPLICATE_DAG_ID
from engine.dag_processing.sync import SyncReport, sync_parse_results
from engine.db.queries.jobs import DAG_PROCESSOR_JOB
from engine.exceptions import DatabaseError
from engine.jobs.service import JobService
from engine.logs import child_environment

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, Process, TaskStatus

    from engine.config import Config
    from engine.crypto import KwargsCipher
    from engine.db.database import Database

logger = logging.getLogger(__name__)

STDOUT_MAX_BYTES: Final = 64 * 1024 * 1024
STDERR_TAIL_BYTES: Final = 64 * 1024
STACK_DUMP_FRACTION: Final = 0.8  # of the timeout, when the child dumps its stack
WATCH_TIMEOUT_MS: Final = 500  # how often the watch thread checks for cancellation
FOLDER_POLL_S: Final = 1.0  # how often a missing dags folder is looked for
TIMEOUT_ERROR: Final = "DagFileTimeout"
CRASH_ERROR: Final = "DagFileProcessError"


@dataclass(frozen=True, slots=True)
class DagProcessorSettings:
    dags_folder: Path
    plugins_folder: Path | None = None
    file_timeout_s: float = 30.0
    refresh_interval_s: float = 30.0  # <= 0: no periodic full pass
    parsing_processes: int = 2
    heartbeat_s: float = 5.0  # of its job row (``sluice jobs list``, ``sluice doctor``)
    #: configured secrets (Fernet keys, the database password): kept out of the children's
    #: environment, as the task processes' (``child_environment``)
    secrets: tuple[str, ...] = ()
    #: ``[core] dags_are_paused_at_creation``: new DAGs stored paused
    paused_at_creation: bool = False

    @classmethod
    def from_config(cls, config: Config) -> DagProcessorSettings:
        return cls(
            dags_folder=config.core.dags_folder,
            plugins_folder=config.core.plugins_folder,
            file_timeout_s=config.core.dag_file_processor_timeout,
            refresh_interval_s=config.scheduler.dag_dir_list_interval,
            heartbeat_s=config.scheduler.scheduler_heartbeat_sec,
            secrets=tuple(config.secret_values()),
            paused_at_creation=config.core.dags_are_paused_at_creation,
        )


def list_dag_files(folder: Path, *, skip: Path | None = None) -> list[Path] | None:
    """Every ``.py`` file under ``folder`` (hidden entries skipped); None if it is missing."""
    if not folder.is_dir():
        return None
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith((".", "__pycache__")) and Path(root, d) != skip
        )
        found.extend(Path(root, f) for f in files if f.endswith(".py") and not f.startswith("."))
    return sorted(found)


def _child_command(
    path: Path, settings: DagProcessorSettings, request_fd: int | None = None
) -> list[str]:
    command = [sys.executable, "-P", "-m", "engine.dag_processing.parsing"]
    if request_fd is not None:
        command += ["--request-fd", str(request_fd)]
    command += ["--dags-folder", str(settings.dags_folder)]
    if settings.plugins_folder is not None:
        command += ["--plugins-folder", str(settings.plugins_folder)]
    dump_at = time.time() + settings.file_timeout_s * STACK_DUMP_FRACTION
    command += ["--dump-stack-at", f"{dump_at:.3f}"]
    return [*command, str(path)]


async def _drain(stream: ByteReceiveStream | None, sink: bytearray, limit: int) -> None:
    """Read ``stream`` to the end, keeping at most ``limit`` bytes (the last ones)."""
    if stream is None:
        return
    async for chunk in stream:
        sink.extend(chunk)
        if len(sink) > limit:
            del sink[: len(sink) - limit]


def _kill_group(process: Process) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _hung_line(stderr: str, fileloc: str) -> int | None:
    """The innermost line of ``fileloc`` in the stack the child dumped before its timeout."""
    lines = re.findall(rf'File "{re.escape(fileloc)}", line (\d+)', stderr)
    return int(lines[0]) if lines else None  # faulthandler prints the innermost frame first


async def parse_in_child(
    path: Path, settings: DagProcessorSettings, server: ParseRequestServer | None = None
) -> FileParseResult:
    """Parse one file in a child process, bounded by ``settings.file_timeout_s``; with a
    ``server``, the file's top-level ``Variable.get`` / ``Connection.get`` are answered by
    it, and the secrets it served are masked in the stored error."""
    result = await _parse_in_child(path, settings, server)
    return result if server is None else server.mask_error(result)


async def _parse_in_child(
    path: Path, settings: DagProcessorSettings, server: ParseRequestServer | None
) -> FileParseResult:
    fileloc = str(path)
    out, err = bytearray(), bytearray()
    ours, theirs = socket.socketpair() if server is not None else (None, None)
    try:
        process = await anyio.open_process(
            _child_command(path, settings, None if theirs is None else theirs.fileno()),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=child_environment(os.environ, settings.secrets),
            pass_fds=() if theirs is None else (theirs.fileno(),),
        )
    except BaseException:
        if ours is not None:
            ours.close()
        raise
    finally:
        if theirs is not None:
            theirs.close()  # the child has its copy
    async with process:
        try:
            with anyio.move_on_after(settings.file_timeout_s) as scope:
                async with anyio.create_task_group() as tg:
                    if server is not None and ours is not None:
                        tg.start_soon(server.serve, ours)
                    async with anyio.create_task_group() as pipes:
                        pipes.start_soon(_drain, process.stdout, out, STDOUT_MAX_BYTES)
                        pipes.start_soon(_drain, process.stderr, err, STDERR_TAIL_BYTES)
                    await process.wait()
                    tg.cancel_scope.cancel()  # the server, if a grandchild holds its end
        finally:
            if process.returncode is None:
                _kill_group(process)
    stderr = err.decode("utf-8", "replace")
    if scope.cancelled_caught:
        message = (
            f"importing the file took longer than {settings.file_timeout_s:g} s ([core] "
            "dag_file_processor_timeout) and was stopped; move slow or blocking work out of "
            "module level"
        )
        error = ParseError(TIMEOUT_ERROR, message, _hung_line(stderr, fileloc), stderr or None)
        return FileParseResult(fileloc=fileloc, error=error)
    return _read_result(fileloc, process.returncode, bytes(out), stderr)


def _read_result(fileloc: str, returncode: int | None, out: bytes, stderr: str) -> FileParseResult:
    problem = f"exited with code {returncode}"
    if returncode == 0:
        try:
            result = FileParseResult.from_json(out.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            problem = f"returned an unreadable result ({exc})"
        else:
            if result.fileloc == fileloc:
                return result
            problem = f"returned the result of another file ({result.fileloc})"
    message = f"the parsing process {problem}; its output ends with: {stderr[-2000:]}"
    return FileParseResult(fileloc=fileloc, error=ParseError(CRASH_ERROR, message, None, stderr))


class DagProcessor:
    """Keeps the metadata DB in line with the dags folder."""

    def __init__(
        self, *, db: Database, cipher: KwargsCipher, settings: DagProcessorSettings
    ) -> None:
        self._db = db
        self._cipher = cipher
        self._settings = settings
        self._pending: set[Path] = set()
        self._wakeup = anyio.Event()
        self._conflicted: set[Path] = set()  # refused for a clash: retried on every pass
        self._logged_errors: dict[str, str] = {}
        #: fileloc -> what its last parse gave (source digest, or the error): a pass that
        #: changes none of it, adds, removes or deactivates nothing is logged at DEBUG
        self._outcomes: dict[str, str | None] = {}
        self._pass_done = anyio.Event()
        self.passes = 0
        self.last_report: SyncReport | None = None

    def __repr__(self) -> str:
        return (
            f"<DagProcessor folder={self._settings.dags_folder} passes={self.passes} "
            f"pending={len(self._pending)}>"
        )

    async def parse_once(self) -> SyncReport | None:
        """Parse every file and sync; None when the dags folder does not exist."""
        return await self._parse(None)

    async def wait_for_pass(self, *, after: int | None = None) -> None:
        """Return once pass number ``after + 1`` (default: the next pass) has been applied."""
        if after is not None and self.passes > after:
            return
        await self._pass_done.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Parse all, report ready, then follow changes until cancelled.

        A ``dag_processor`` job row with heartbeats says it is alive (``sluice jobs list``).
        """
        job = JobService(
            self._db,
            job_type=DAG_PROCESSOR_JOB,
            part="DAG processor",
            heartbeat_s=self._settings.heartbeat_s,
        )
        async with job.running(), anyio.create_task_group() as tg:
            await self._parse_logged(None)
            tg.start_soon(self._watch_folders)
            task_status.started()
            while True:
                await self._wait_for_work()
                changed, self._pending = self._pending, set()
                self._wakeup = anyio.Event()
                full = not changed or self._touches_plugins(changed)
                await self._parse_logged(None if full else changed)

    async def _wait_for_work(self) -> None:
        interval_s = self._settings.refresh_interval_s
        with anyio.move_on_after(interval_s if interval_s > 0 else math.inf):
            await self._wakeup.wait()

    def _touches_plugins(self, changed: set[Path]) -> bool:
        plugins = self._settings.plugins_folder
        return plugins is not None and any(path.is_relative_to(plugins) for path in changed)

    async def _watch_folders(self) -> None:
        """Follow file changes. A dags folder that does not exist yet (a deploy often creates
        it after the engine starts) is looked for every ``FOLDER_POLL_S``; once it appears,
        a full pass parses what it already holds and its changes are followed from then on."""
        dags_folder = self._settings.dags_folder
        if not dags_folder.is_dir():
            while True:  # polled: there is nothing to watch before the folder exists
                await anyio.sleep(FOLDER_POLL_S)
                if dags_folder.is_dir():
                    break
            logger.info(
                "The dags folder %s exists now; parsing it",
                dags_folder,
                extra={"action": "dags_folder_found", "path": str(dags_folder)},
            )
            self._wakeup.set()  # a full pass: files written before the watch began
        folders = [
            folder
            for folder in (dags_folder, self._settings.plugins_folder)
            if folder is not None and folder.is_dir()
        ]
        changes_stream = watchfiles.awatch(
            *folders, watch_filter=watchfiles.PythonFilter(), rust_timeout=WATCH_TIMEOUT_MS
        )
        try:
            async for changes in changes_stream:
                self._pending.update(Path(path) for _, path in changes)
                self._wakeup.set()
        except OSError as exc:  # e.g. the folder was removed: the periodic pass carries on
            logger.warning(
                "Stopped watching %s for changes (%s); files are still re-parsed every %g s",
                ", ".join(map(str, folders)),
                exc,
                self._settings.refresh_interval_s,
                extra={"action": "dags_folder_watch_stopped"},
            )

    async def _parse_logged(self, paths: set[Path] | None) -> None:
        try:
            await self._parse(paths)
        except DatabaseError as exc:
            logger.error(
                "DAG processing pass failed, retrying on the next one: %s",
                exc,
                extra={"action": "dag_processing_failed"},
            )
            self._pending.update(paths or ())

    async def _parse(self, paths: set[Path] | None) -> SyncReport | None:
        settings = self._settings
        listing = await anyio.to_thread.run_sync(
            partial(list_dag_files, settings.dags_folder, skip=settings.plugins_folder)
        )
        if listing is None:
            logger.error(
                "The dags folder %s does not exist; nothing parsed, DAGs left as they are; it "
                "is parsed as soon as it is created",
                settings.dags_folder,
                extra={"action": "dags_folder_missing", "path": str(settings.dags_folder)},
            )
            return None
        wanted = None if paths is None else paths | self._conflicted
        todo = listing if wanted is None else [path for path in listing if path in wanted]
        fresh = await self._parse_files(todo)
        present = {str(path) for path in listing}
        now = datetime.now(UTC)
        sync = partial(
            sync_parse_results,
            cipher=self._cipher,
            fresh=fresh,
            present=present,
            now=now,
            paused_at_creation=settings.paused_at_creation,
        )
        report = await self._db.run(sync)
        self._conflicted = {
            Path(fileloc)
            for fileloc, error in report.errors.items()
            if error.type in (DUPLICATE_DAG_ID, ASSET_CONFLICT)
        }
        self._log_report(report, todo, listing)
        self._log_summary(report, self._note_outcomes(fresh, listing))
        self.passes += 1
        self.last_report = report
        self._pass_done.set()
        self._pass_done = anyio.Event()
        return report

    async def _parse_files(self, paths: list[Path]) -> dict[str, FileParseResult]:
        results: dict[str, FileParseResult] = {}
        limiter = anyio.CapacityLimiter(max(1, self._settings.parsing_processes))

        async def parse(path: Path) -> None:
            async with limiter:
                server = ParseRequestServer(db=self._db, cipher=self._cipher, fileloc=str(path))
                results[str(path)] = await parse_in_child(path, self._settings, server)

        async with anyio.create_task_group() as tg:
            for path in paths:
                tg.start_soon(parse, path)
        return results

    def _log_report(self, report: SyncReport, parsed: list[Path], listing: list[Path]) -> None:
        """Each new or changed file error once, each fixed one once."""
        for path in parsed:
            fileloc, error = str(path), report.errors.get(str(path))
            previous = self._logged_errors.pop(fileloc, None)
            if error is None:
                if previous is not None:
                    logger.info(
                        "DAG file %s parses again", fileloc, extra={"action": "dag_file_fixed"}
                    )
                continue
            text = self._logged_errors[fileloc] = error.describe(fileloc)
            if text != previous:
                logger.warning(
                    "DAG file error: %s",
                    text,
                    extra={"action": "dag_file_error", "fileloc": fileloc, "line": error.lineno},
                )
        present = {str(path) for path in listing}
        for fileloc in [f for f in self._logged_errors if f not in present]:
            del self._logged_errors[fileloc]

    def _note_outcomes(self, fresh: dict[str, FileParseResult], listing: list[Path]) -> bool:
        """Remember what each file's parse gave; whether a file appeared, went, or now
        parses to something else (another source, another error) since the last pass."""
        present = {str(path) for path in listing}
        changed = present != self._outcomes.keys()
        # a file listed but not parsed yet (a partial pass) counts as changed once parsed
        self._outcomes = {f: self._outcomes.get(f) for f in present}
        for fileloc, result in fresh.items():
            error = result.error
            outcome = result.source_sha256 if error is None else error.describe(fileloc)
            changed = changed or self._outcomes.get(fileloc) != outcome
            self._outcomes[fileloc] = outcome
        return changed

    def _log_summary(self, report: SyncReport, files_changed: bool) -> None:
        """The pass in one line: at INFO when something changed (the first pass, a file, a
        DAG, a watcher trigger), at DEBUG when the pass found everything as it was (a
        periodic re-parse of an untouched folder says nothing new every few seconds)."""
        changed = files_changed or any(
            (
                report.dags_added,
                report.dags_deactivated,
                report.triggers_created,
                report.triggers_deleted,
                report.files_removed,
            )
        )
        logger.log(
            logging.INFO if changed else logging.DEBUG,
            "Parsed %d DAG files: %d active DAGs (+%d, -%d), watcher triggers +%d -%d, "
            "%d files with errors",
            report.files_parsed,
            report.dags_active,
            len(report.dags_added),
            len(report.dags_deactivated),
            report.triggers_created,
            report.triggers_deleted,
            len(report.errors),
            extra={"action": "dag_processing_pass", "changed": changed},
        )
