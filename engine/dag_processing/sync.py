"""Applying a DAG sync: one transaction that brings the tables in line with the plan.

The last good parse result of every DAG file is kept, encrypted, in ``dag_file`` (watcher
kwargs can hold secrets). ``DagSync`` reads the tables, lets ``engine.dag_processing.planning``
accept the fresh results and plan the desired state, and writes only the differences: the
stored files and parse errors, the DAGs and their tasks, the assets, the schedule edges and
the watchers' trigger rows. A file whose import fails keeps its previous version.

Each watcher that runs has one ``trigger`` row of kind ``watcher``. A watcher whose
classpath or kwargs changed gets a new trigger row and the old row is deleted (the
triggerer stops triggers whose row is gone); kwargs are compared by decrypting the stored
row, never by a hash that could leak guessable secrets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.dag_processing.parsing import FileParseResult, ParsedWatcher, ParseError
from engine.dag_processing.planning import (
    Acceptance,
    DesiredState,
    accept_results,
    dag_columns,
    plan,
    task_rows,
)
from engine.db.queries import claims as store_claims
from engine.db.queries import dags as dags_sql
from engine.db.queries import deferrals
from engine.db.queries import triggers as trigger_rows
from engine.exceptions import DecryptionError
from engine.states import TriggerKind
from triggers.serde import loads_kwargs

if TYPE_CHECKING:
    from collections.abc import Mapping, Set
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SyncReport:
    files_parsed: int = 0
    dags_active: int = 0
    dags_added: list[str] = field(default_factory=list)
    dags_deactivated: list[str] = field(default_factory=list)
    triggers_created: int = 0
    triggers_deleted: int = 0
    files_removed: list[str] = field(default_factory=list)
    errors: dict[str, ParseError] = field(default_factory=dict)


class DagSync:
    """One sync: reads the tables, writes the differences (run it in a worker thread)."""

    def __init__(
        self,
        session: Session,
        cipher: KwargsCipher,
        *,
        now: datetime,
        paused_at_creation: bool = False,
    ) -> None:
        self._session = session
        self._cipher = cipher
        self._now = now
        #: ``[core] dags_are_paused_at_creation``: a new DAG's pause unless it says otherwise
        self._paused_at_creation = paused_at_creation
        self.report = SyncReport()

    def __repr__(self) -> str:
        return f"<DagSync {self.report!r}>"

    def run(self, fresh: Mapping[str, FileParseResult], present: Set[str]) -> SyncReport:
        """Apply ``fresh`` results; ``present`` holds every file now in the dags folder."""
        self.report.files_parsed = len(fresh)
        stored = dags_sql.load_dag_files(self._session)
        last_good = self._decrypt_files(stored, present)
        dag_rows = dags_sql.load_dags(self._session)
        owners = {dag_id: row.fileloc for dag_id, row in dag_rows.items() if row.is_active}
        acceptance = accept_results(last_good, fresh, owners)
        self._save_files(stored, last_good, fresh, acceptance, present)
        self._save_errors(fresh, acceptance.rejected, present)
        desired = plan(acceptance.files)
        self._sync_dags(desired, dag_rows, acceptance.accepted)
        asset_ids = self._sync_assets(desired)
        self._sync_edges(desired, asset_ids)
        self._sync_watchers(desired, asset_ids)
        return self.report

    def _decrypt_files(
        self, stored: Mapping[str, str], present: Set[str]
    ) -> dict[str, FileParseResult]:
        last_good: dict[str, FileParseResult] = {}
        for fileloc, token in stored.items():
            if fileloc not in present:
                continue
            try:
                last_good[fileloc] = FileParseResult.from_json(self._cipher.decrypt(token))
            except (DecryptionError, ValueError) as exc:
                logger.warning(
                    "Ignoring the stored last good parse of %s: %s",
                    fileloc,
                    exc,
                    extra={"action": "dag_file_unreadable", "fileloc": fileloc},
                )
        return last_good

    def _save_files(
        self,
        stored: Mapping[str, str],
        last_good: Mapping[str, FileParseResult],
        fresh: Mapping[str, FileParseResult],
        acceptance: Acceptance,
        present: Set[str],
    ) -> None:
        changed: dict[str, tuple[str, str | None]] = {}
        for fileloc in sorted(acceptance.accepted):
            result = fresh[fileloc]
            if last_good.get(fileloc) != result:  # its source's digest counts, its text not
                token = self._cipher.encrypt(result.without_source().to_json())
                source = None if result.source is None else self._cipher.encrypt(result.source)
                changed[fileloc] = (token, source)
        dags_sql.save_dag_files(self._session, changed, now=self._now)
        removed = sorted(fileloc for fileloc in stored if fileloc not in present)
        dags_sql.delete_dag_files(self._session, removed)
        self.report.files_removed = removed

    def _save_errors(
        self,
        fresh: Mapping[str, FileParseResult],
        rejected: Mapping[str, ParseError],
        present: Set[str],
    ) -> None:
        errors = {f: r.error for f, r in fresh.items() if r.error is not None}
        errors.update(rejected)
        rows = [
            {
                "fileloc": fileloc,
                "error": f"{error.type}: {error.message}",
                "lineno": error.lineno,
                "stacktrace": error.traceback,
                "timestamp": self._now,
            }
            for fileloc, error in sorted(errors.items())
        ]
        gone = {f for f in dags_sql.parse_error_filelocs(self._session) if f not in present}
        dags_sql.replace_parse_errors(self._session, set(fresh) | gone, rows)
        self.report.errors = errors

    def _sync_dags(
        self,
        desired: DesiredState,
        rows: Mapping[str, dags_sql.DagRowState],
        accepted: Set[str],
    ) -> None:
        """The DAG rows and their tasks in line with ``desired``, in a few statements for any
        number of DAGs: new DAGs inserted at once, re-parsed ones that changed nothing but
        their parse time in one update, the task rows of the DAGs whose tasks changed
        replaced at once (a changed DAG row is still one update)."""
        stored_tasks = dags_sql.load_dag_tasks(self._session)
        stored_starts = deferrals.load_start_triggers(self._session)
        new_rows: list[dict[str, Any]] = []
        reparsed: list[str] = []  # only their last_parsed_time changes
        new_tasks: dict[str, list[dict[str, Any]]] = {}
        for dag_id, (fileloc, dag) in sorted(desired.dags.items()):
            parsed = dag_columns(dag)
            row = rows.get(dag_id)
            if row is None:
                values = {"fileloc": fileloc, "is_active": True, **parsed}
                values["last_parsed_time"] = self._now
                paused = dag.is_paused_upon_creation
                values["is_paused"] = self._paused_at_creation if paused is None else paused
                new_rows.append({"dag_id": dag_id, **values})
                self.report.dags_added.append(dag_id)
            else:
                changes = {k: v for k, v in parsed.items() if row.parsed.get(k) != v}
                if row.fileloc != fileloc:
                    changes["fileloc"] = fileloc
                if not row.is_active:
                    changes["is_active"] = True
                if not row.is_active or any(k in changes for k in dags_sql.TIME_COLUMNS):
                    changes["next_dagrun_computed"] = False
                if changes:
                    if fileloc in accepted:
                        changes["last_parsed_time"] = self._now
                    dags_sql.update_dag(self._session, dag_id, changes)
                elif fileloc in accepted:
                    reparsed.append(dag_id)
            wanted_tasks = task_rows(dag)
            starts = {t.task_id: t.start_trigger for t in dag.tasks if t.start_trigger}
            if stored_tasks.get(dag_id, []) != wanted_tasks or self._starts_changed(
                dag_id, starts, stored_starts
            ):
                new_tasks[dag_id] = self._with_starts(wanted_tasks, starts)
        dags_sql.insert_dags(self._session, new_rows)
        dags_sql.set_last_parsed(self._session, reparsed, self._now)
        dags_sql.replace_tasks_of_dags(self._session, new_tasks)
        retired = sorted(d for d, row in rows.items() if row.is_active and d not in desired.dags)
        dags_sql.deactivate_dags(self._session, retired)
        self.report.dags_deactivated = retired
        self.report.dags_active = len(desired.dags)

    def _starts_changed(
        self, dag_id: str, wanted: Mapping[str, str], stored: Mapping[tuple[str, str], str]
    ) -> bool:
        """Whether the start_from_trigger args differ (compared decrypted: tokens never repeat)."""
        mine = {task_id: token for (d, task_id), token in stored.items() if d == dag_id}
        if mine.keys() != wanted.keys():
            return True
        try:
            return any(self._cipher.decrypt(mine[t]) != text for t, text in wanted.items())
        except DecryptionError:
            return True

    def _with_starts(
        self, rows: list[dict[str, Any]], starts: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Task rows with ``start_trigger`` (encrypted: trigger kwargs can hold secrets)."""
        return [
            {
                **row,
                "start_trigger": (
                    self._cipher.encrypt(starts[row["task_id"]])
                    if row["task_id"] in starts
                    else None
                ),
            }
            for row in rows
        ]

    def _sync_assets(self, desired: DesiredState) -> dict[str, int]:
        rows = dags_sql.load_assets(self._session)
        ids = {name: row.id for name, row in rows.items()}
        for name, asset in sorted(desired.assets.items()):
            row = rows.get(name)
            if row is None:
                ids[name] = dags_sql.insert_asset(
                    self._session, name=name, uri=asset.uri, extra=asset.extra, now=self._now
                )
            elif (row.uri, row.extra, row.is_active) != (asset.uri, asset.extra, True):
                values = {"uri": asset.uri, "extra": asset.extra, "is_active": True}
                dags_sql.update_asset(self._session, row.id, values)
        for name, row in rows.items():
            if row.is_active and name not in desired.assets:
                dags_sql.update_asset(self._session, row.id, {"is_active": False})
        return ids

    def _sync_edges(self, desired: DesiredState, asset_ids: Mapping[str, int]) -> None:
        wanted = {(dag_id, asset_ids[name]) for dag_id, name in desired.edges}
        existing = dags_sql.load_schedule_edges(self._session)
        dags_sql.delete_schedule_edges(self._session, existing - wanted)
        dags_sql.add_schedule_edges(self._session, wanted - existing)
        aliases = dags_sql.load_schedule_alias_edges(self._session)
        dags_sql.replace_schedule_alias_edges(
            self._session, desired.alias_edges - aliases, aliases - desired.alias_edges
        )

    def _sync_watchers(self, desired: DesiredState, asset_ids: Mapping[str, int]) -> None:
        wanted = {(asset_ids[a], w): spec for (a, w), spec in desired.watchers.items()}
        existing = {(r.asset_id, r.name): r for r in dags_sql.load_asset_watchers(self._session)}
        gone = [row for key, row in existing.items() if key not in wanted]
        dags_sql.delete_asset_watchers(self._session, [row.id for row in gone])
        replaced: list[int] = [row.trigger_id for row in gone]
        for (asset_id, name), spec in sorted(wanted.items()):
            row = existing.get((asset_id, name))
            if row is not None and self._same_trigger(row, spec):
                if spec.stream_digest is not None and row.stream_digest != spec.stream_digest:
                    # Written before digests existed (or the key's encoding changed): the
                    # triggerer keeps the group whole by this digest from now on.
                    store_claims.set_stream_digest(
                        self._session, row.trigger_id, spec.stream_digest
                    )
                continue
            trigger_id = trigger_rows.add_trigger_row(
                self._session,
                self._cipher,
                spec.classpath,
                loads_kwargs(spec.kwargs),
                kind=TriggerKind.WATCHER,
                stream_digest=spec.stream_digest,
            )
            self.report.triggers_created += 1
            if row is None:
                dags_sql.add_asset_watcher(
                    self._session, asset_id=asset_id, name=name, trigger_id=trigger_id
                )
            else:
                dags_sql.set_watcher_trigger(self._session, row.id, trigger_id)
                replaced.append(row.trigger_id)
        trigger_rows.delete_triggers(self._session, replaced)
        self.report.triggers_deleted = len(replaced)

    def _same_trigger(self, row: dags_sql.WatcherRowState, spec: ParsedWatcher) -> bool:
        if row.classpath != spec.classpath:
            return False
        try:
            return self._cipher.decrypt(row.kwargs, trigger_id=row.trigger_id) == spec.kwargs
        except DecryptionError:
            logger.warning(
                "Replacing watcher trigger %s: its kwargs cannot be decrypted",
                row.trigger_id,
                extra={"action": "watcher_trigger_unreadable", "trigger_id": row.trigger_id},
            )
            return False


def sync_parse_results(
    session: Session,
    cipher: KwargsCipher,
    fresh: Mapping[str, FileParseResult],
    present: Set[str],
    *,
    now: datetime,
    paused_at_creation: bool = False,
) -> SyncReport:
    """Apply one pass of parse results in ``session`` (one transaction); a DAG seen for the
    first time is stored paused per its ``is_paused_upon_creation``, else
    ``paused_at_creation`` (``[core] dags_are_paused_at_creation``).

    Several DAG processors (one per engine) may sync the same folder at once: on PostgreSQL
    the transaction first takes an advisory lock, so each pass reads what the previous one
    committed instead of racing it to insert the same rows (SQLite serializes writers).
    """
    dags_sql.lock_dag_sync(session)
    sync = DagSync(session, cipher, now=now, paused_at_creation=paused_at_creation)
    return sync.run(fresh, present)
