"""The DAG processor: parses the dags folder in child processes and syncs the metadata DB.

Each ``.py`` file is imported by its own child (``engine.dag_processing.children``: forked
from the pre-imported parse runner while ``run()`` runs, else a fresh interpreter), at most
``parsing_processes`` at a time, bounded by ``[core] dag_file_processor_timeout``. The
results of one pass are applied in one transaction (``engine.dag_processing.sync``).

``run()`` parses everything, reports ready, then re-parses only what changed: a file that
changed, and the files that imported a module of the dags or plugins folder that changed
(each child reports the modules of those folders it imported), plus the files that failed
(a module they missed may have come). A file whose last parse timed out (in this process, or
as the database's parse errors say at start) is parsed aside, beside the passes and synced on
its own when it ends, so that one hanging file holds neither the engine's start nor every
other file's change for ``[core] dag_file_processor_timeout``. Changes come from the
file watch (watchfiles), and
from a listing of the folders every ``[scheduler] dag_dir_list_interval`` seconds (a
``stat`` per file) for what the watch missed. Every file is parsed again every ``[scheduler]
min_file_process_interval`` seconds (default 300), changed or not, for what it reads at
parse time (a Variable, an environment variable, another file): Airflow re-parses every
file every 30 s with that key, as it has no other way to see a change. ``parse_once()`` does
one full pass (tests, CLI).
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from contextlib import asynccontextmanager, nullcontext
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import watchfiles

from engine.dag_processing import parse_runner
from engine.dag_processing.children import TIMEOUT_ERROR as TIMEOUT_ERROR
from engine.dag_processing.children import parse_in_child
from engine.dag_processing.parse_requests import ParseRequestServer
from engine.dag_processing.planning import ASSET_CONFLICT, DUPLICATE_DAG_ID
from engine.dag_processing.settings import (  # noqa: TC001 - callers import it from here
    DagProcessorSettings as DagProcessorSettings,
)
from engine.dag_processing.sync import SyncReport, sync_parse_results
from engine.db.queries import dags as dags_sql
from engine.db.queries.jobs import DAG_PROCESSOR_JOB
from engine.exceptions import DatabaseError
from engine.jobs.service import JobService
from engine.logs import child_environment
from engine.warm.service import WarmRunner

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from anyio.abc import TaskGroup, TaskStatus

    from engine.crypto import KwargsCipher
    from engine.dag_processing.parsing import FileParseResult
    from engine.db.database import Database

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_MS: Final = 500  # how often the watch thread checks for cancellation
FOLDER_POLL_S: Final = 1.0  # how often a missing dags folder is looked for
PARSE_RUNNER_LABEL: Final = "parse runner"

#: a file's ``stat`` as the listing sees it: a different one is a change
Stamp = tuple[int, int]


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


def stamp(path: Path) -> Stamp | None:
    """``path``'s modification time and size; None when it is gone."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def stamp_folders(folders: Iterable[Path | None]) -> dict[Path, Stamp]:
    """The stamp of every ``.py`` file of ``folders`` (the missing ones hold none)."""
    stamps: dict[Path, Stamp] = {}
    for folder in folders:
        for path in (None if folder is None else list_dag_files(folder)) or ():
            if (found := stamp(path)) is not None:
                stamps[path] = found
    return stamps


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
        #: forks the parsing children while ``forking()`` is entered (``run()`` enters it)
        self.parse_runner: WarmRunner | None = None
        #: per file, the modules of the dags and plugins folders it imported (its last parse)
        self._imports: dict[str, frozenset[str]] = {}
        #: files whose last parse failed (not by a timeout): parsed again on any change
        self._failed: set[str] = set()
        #: files whose last parse timed out: while ``run()`` runs, parsed aside (not in a
        #: pass, which would wait for them), each at most once at a time (``_aside``), one
        #: file at a time (many files hanging on a dead share are not as many children)
        self._timed_out: set[str] = set()
        self._aside: set[Path] = set()
        self._aside_limiter = anyio.CapacityLimiter(1)
        #: one sync at a time: a pass's and an aside parse's
        self._sync_lock = anyio.Lock()
        #: the files of the folders as last listed or seen changed
        self._seen: dict[Path, Stamp] = {}
        self._refresh_at = math.inf
        #: how many times each file was parsed (the counts a test or a probe reads)
        self.parses: Counter[str] = Counter()

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

    @asynccontextmanager
    async def forking(self) -> AsyncIterator[WarmRunner]:
        """While inside, files are parsed in children forked from a parse runner, started
        here and stopped on the way out (a file parses cold while it is not ready)."""
        settings = self._settings
        runner = WarmRunner(
            module=parse_runner.MODULE,
            label=PARSE_RUNNER_LABEL,
            environment=partial(child_environment, os.environ, settings.secrets),
            dag_folders=[f for f in (settings.dags_folder, settings.plugins_folder) if f],
            standbys=settings.parsing_processes,  # one ready for each parse at a time
        )
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            self.parse_runner = runner
            try:
                yield runner
            finally:
                self.parse_runner = None
                tg.cancel_scope.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Parse all, report ready, then follow changes until cancelled.

        A ``dag_processor`` job row with heartbeats says it is alive (``sluice jobs list``).
        """
        settings = self._settings
        job = JobService(
            self._db,
            job_type=DAG_PROCESSOR_JOB,
            part="DAG processor",
            heartbeat_s=settings.heartbeat_s,
        )
        forking = self.forking() if settings.parse_runner else nullcontext()
        async with job.running(), forking, anyio.create_task_group() as tg:
            self._seen = await anyio.to_thread.run_sync(self._stamp_folders)
            self._timed_out = await self._stored_timeouts()
            await self._parse_logged(None, aside=tg)
            tg.start_soon(self._watch_folders)
            if settings.list_interval_s > 0:
                tg.start_soon(self._poll_folders)
            task_status.started()
            while True:
                refresh = await self._wait_for_work()
                changed, self._pending = self._pending, set()
                self._wakeup = anyio.Event()
                full = refresh or not changed
                await self._parse_logged(None if full else self._affected(changed), aside=tg)

    async def _stored_timeouts(self) -> set[str]:
        """The files whose stored error is a timeout (the last parse of an engine before
        this one): the first pass parses them aside, so that the engine is ready without
        waiting for them."""
        try:
            rows = await self._db.read(dags_sql.list_parse_errors)
        except DatabaseError:
            return set()  # the first pass reports the database
        return {row.fileloc for row in rows if row.error.startswith(f"{TIMEOUT_ERROR}:")}

    async def _wait_for_work(self) -> bool:
        """Until a change comes (False) or the periodic refresh is due (True)."""
        with anyio.move_on_after(max(0.0, self._refresh_at - anyio.current_time())):
            await self._wakeup.wait()
            return False
        return True

    def _affected(self, changed: set[Path]) -> set[Path]:
        """The files to parse again for the ``changed`` paths: those themselves, the files
        that imported one of them, and the files that failed (a module they missed, or an
        error in a module they import, may be one of them)."""
        names = {str(path) for path in changed}
        importers = {f for f, modules in self._imports.items() if not modules.isdisjoint(names)}
        return changed | {Path(fileloc) for fileloc in importers | self._failed}

    def _stamp_folders(self) -> dict[Path, Stamp]:
        return stamp_folders((self._settings.dags_folder, self._settings.plugins_folder))

    def _note_changes(self, paths: Iterable[Path]) -> None:
        """Take changed ``paths`` as pending; their stamps as the listing's (so that the
        next listing does not report them again)."""
        for path in paths:
            if (found := stamp(path)) is None:
                self._seen.pop(path, None)
            else:
                self._seen[path] = found
            self._pending.add(path)
        self._wakeup.set()

    async def _poll_folders(self) -> None:
        """List the folders every ``list_interval_s``: what changed since the last listing
        (and the watch did not report) is parsed."""
        while True:
            await anyio.sleep(self._settings.list_interval_s)
            listed = await anyio.to_thread.run_sync(self._stamp_folders)
            seen, self._seen = self._seen, listed
            changed = {p for p in listed.keys() | seen.keys() if listed.get(p) != seen.get(p)}
            if changed:
                self._pending |= changed
                self._wakeup.set()

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
                self._note_changes(Path(path) for _, path in changes)
        except OSError as exc:  # e.g. the folder was removed: the periodic pass carries on
            logger.warning(
                "Stopped watching %s for changes (%s); the folders are still listed for "
                "changes every %g s",
                ", ".join(map(str, folders)),
                exc,
                self._settings.list_interval_s,
                extra={"action": "dags_folder_watch_stopped"},
            )

    async def _parse_logged(self, paths: set[Path] | None, *, aside: TaskGroup) -> None:
        try:
            await self._parse(paths, aside=aside)
        except DatabaseError as exc:
            logger.error(
                "DAG processing pass failed, retrying on the next one: %s",
                exc,
                extra={"action": "dag_processing_failed"},
            )
            self._pending.update(paths or ())

    async def _list(self) -> list[Path] | None:
        settings = self._settings
        return await anyio.to_thread.run_sync(
            partial(list_dag_files, settings.dags_folder, skip=settings.plugins_folder)
        )

    async def _parse(
        self, paths: set[Path] | None, *, aside: TaskGroup | None = None
    ) -> SyncReport | None:
        """Parse ``paths`` (every file when None) and sync. With ``aside``, the files whose
        last parse timed out are parsed in a task of that group instead (``_parse_aside``)."""
        settings = self._settings
        listing = await self._list()
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
        if paths is None:
            interval_s = settings.refresh_interval_s
            self._refresh_at = anyio.current_time() + interval_s if interval_s > 0 else math.inf
        if aside is not None:
            for path in (p for p in todo if str(p) in self._timed_out and p not in self._aside):
                self._aside.add(path)
                aside.start_soon(self._parse_aside, path)
            todo = [path for path in todo if str(path) not in self._timed_out]
        fresh = await self._parse_files(todo)
        return await self._apply(fresh, todo, listing)

    async def _parse_aside(self, path: Path) -> None:
        """Parse ``path`` (its last parse timed out) and sync its result alone. A change of
        the file while it was parsed, or a failed sync, parses it again in the next pass."""
        try:
            async with self._aside_limiter:
                before = stamp(path)
                fresh = await self._parse_files([path])
            listing = await self._list()
            if listing is not None and path in listing:  # a file gone meanwhile: its pass
                await self._apply(fresh, [path], listing)
        except DatabaseError as exc:
            logger.error(
                "Syncing the parse of %s failed, parsing it again in the next pass: %s",
                path,
                exc,
                extra={"action": "dag_processing_failed"},
            )
            self._note_changes([path])
        else:
            if stamp(path) != before:
                self._note_changes([path])
        finally:
            self._aside.discard(path)

    async def _apply(
        self, fresh: dict[str, FileParseResult], parsed: list[Path], listing: list[Path]
    ) -> SyncReport:
        """Sync the ``fresh`` results of the ``parsed`` files (the folder now ``listing``),
        one sync at a time, and log what changed."""
        async with self._sync_lock:
            present = {str(path) for path in listing}
            self._remember(fresh, present)
            sync = partial(
                sync_parse_results,
                cipher=self._cipher,
                fresh=fresh,
                present=present,
                now=datetime.now(UTC),
                paused_at_creation=self._settings.paused_at_creation,
            )
            report = await self._db.run(sync)
            # the report's errors are the parsed files': the others keep their standing
            self._conflicted = {p for p in self._conflicted if str(p) not in fresh} | {
                Path(fileloc)
                for fileloc, error in report.errors.items()
                if error.type in (DUPLICATE_DAG_ID, ASSET_CONFLICT)
            }
            self._log_report(report, parsed, listing)
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
                result = await parse_in_child(path, self._settings, server, self.parse_runner)
                results[str(path)] = result

        async with anyio.create_task_group() as tg:
            for path in paths:
                tg.start_soon(parse, path)
        return results

    def _remember(self, fresh: dict[str, FileParseResult], present: set[str]) -> None:
        """What the next passes need of this one: each file's imports, which ones failed."""
        for fileloc, result in fresh.items():
            self.parses[fileloc] += 1
            self._imports[fileloc] = frozenset(result.imports)
            error = result.error
            timed_out = error is not None and error.type == TIMEOUT_ERROR
            if error is not None and not timed_out:
                self._failed.add(fileloc)
            else:
                self._failed.discard(fileloc)
            if timed_out:
                self._timed_out.add(fileloc)
            else:
                self._timed_out.discard(fileloc)
        self._failed &= present
        self._timed_out &= present
        for fileloc in [f for f in self._imports if f not in present]:
            del self._imports[fileloc]

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
