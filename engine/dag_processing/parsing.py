"""Import one DAG file and describe what it declares as plain data (the DAG processor's child).

The DAG processor runs
``python -P -m engine.dag_processing.parsing --dags-folder D --plugins-folder P FILE`` per
file: a broken or hanging file cannot take the engine down, and the parent kills a child
that runs out of time. The child prints one JSON document (``FileParseResult.to_json``) on
its standard output; anything the DAG file prints goes to standard error instead.

A result holds the DAGs (ids, schedules, tasks and edges) and assets (with each watcher's
trigger classpath and kwargs, serialized with ``triggers.serde.dumps_kwargs``: they may hold
secrets, so the parent encrypts them and never logs them), or the error that stopped the
import, with its line in the file. A good result also carries the source the child ran (it
reads the file once and runs those bytes) and its sha256: the parent stores them as the
file's last good version, which a task runs when the file on disk is broken.

A task process imports DAG files the same way (``engine.execution.loading``) to run a task.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from datetime import UTC
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import Asset, AssetAlias
from engine.authoring.baseoperator import MappedOperator
from engine.authoring.dag import DAG, take_registered_dags
from engine.authoring.dag_files import (
    DAG_MODULE_PREFIX,
    add_import_paths,
    collect_dags,
    decode_source,
    import_dag_file,
    source_digest,
)
from engine.authoring.errors import DagDefinitionError
from engine.authoring.params import param_spec
from engine.authoring.store import install_store
from engine.authoring.timetables import timezone_name
from engine.dag_processing.parse_store import ParseTimeStore
from engine.dag_processing.results import FileParseResult as FileParseResult
from engine.dag_processing.results import ParsedAsset as ParsedAsset
from engine.dag_processing.results import ParsedDag as ParsedDag
from engine.dag_processing.results import ParsedTask as ParsedTask
from engine.dag_processing.results import ParsedWatcher as ParsedWatcher
from engine.dag_processing.results import ParseError as ParseError
from engine.loader import trigger_stream_digest
from engine.logs import Redactor
from triggers.serde import dumps, dumps_kwargs

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from engine.authoring.assets import AssetWatcher
    from engine.authoring.baseoperator import BaseOperator


TRACEBACK_MAX_CHARS: Final = 20_000
#: the stack is dumped at least this long after start, even when the moment has passed
MIN_DUMP_DELAY_S: Final = 0.05


def describe_start_trigger(task: BaseOperator) -> str | None:
    """A start_from_trigger task's ``start_trigger_args`` as tagged JSON text, else None.

    The document holds ``classpath``, ``kwargs`` (``dumps_kwargs`` text), ``next_method``,
    ``next_kwargs`` (``dumps`` text) and ``timeout_s``; the scheduler defers the task with
    it without importing the DAG file (``engine.db.queries.deferrals.start_from_trigger``).
    """
    try:
        deferred = task.deferral_at_start()
        if deferred is None:
            return None
        document = {
            "classpath": deferred.classpath,
            "kwargs": dumps_kwargs(deferred.trigger_kwargs, owner=deferred.classpath),
            "next_method": deferred.method_name,
            "next_kwargs": dumps(deferred.kwargs, where="next_kwargs"),
            "timeout_s": None if deferred.timeout is None else deferred.timeout.total_seconds(),
        }
        return dumps(document, where="start_trigger_args")
    except DagDefinitionError:
        raise
    except (TypeError, ValueError) as exc:  # SerializationError is a TypeError
        raise DagDefinitionError(
            f"task {task.task_id!r}: invalid start_trigger_args: {exc}"
        ) from exc


def describe_dag(dag: DAG) -> ParsedDag:
    tasks = tuple(
        ParsedTask(
            task_id=task.task_id,
            operator=task.operator_classpath,
            downstream=tuple(sorted(task.downstream_task_ids)),
            retries=task.retries,
            start_from_trigger=bool(task.start_from_trigger),
            execution_timeout_s=(
                None if task.execution_timeout is None else task.execution_timeout.total_seconds()
            ),
            start_trigger=describe_start_trigger(task),
            outlets=_names(task.outlets, Asset),
            outlet_aliases=_names(task.outlets, AssetAlias),
            inlets=_names(task.inlets, Asset),
            inlet_aliases=_names(task.inlets, AssetAlias),
            trigger_rule=str(task.trigger_rule),
            retry_delay_s=task.retry_delay.total_seconds(),
            retry_exponential_backoff=task.retry_exponential_backoff,
            max_retry_delay_s=(
                None if task.max_retry_delay is None else task.max_retry_delay.total_seconds()
            ),
            mapping=task.mapping_json() if isinstance(task, MappedOperator) else None,
            pool=task.pool,
            pool_slots=task.pool_slots,
            queue=task.queue,
            is_setup=task.is_setup,
            is_teardown=task.is_teardown,
            on_failure_fail_dagrun=task.on_failure_fail_dagrun,
            edge_labels=dag.edge_labels_of(task.task_id) or None,
        )
        for task in (dag.get_task(tid) for tid in dag.topological_task_ids())
    )
    timetable = dag.timetable
    return ParsedDag(
        dag_id=dag.dag_id,
        lineno=dag.lineno,
        description=dag.description,
        schedule=dag.schedule_json(),
        schedule_assets=tuple(dag.schedule.asset_names()) if dag.schedule else (),
        schedule_aliases=tuple(dag.schedule.alias_names()) if dag.schedule else (),
        tasks=tasks,
        timetable=None if timetable is None else timetable.serialize(),
        timetable_summary=None if timetable is None else timetable.summary,
        timezone=timezone_name(dag.timezone),
        start_date=_iso(dag.start_date),
        end_date=_iso(dag.end_date),
        catchup=dag.catchup,
        max_active_runs=dag.max_active_runs,
        max_active_tasks=dag.max_active_tasks,
        dagrun_timeout_s=(
            None if dag.dagrun_timeout is None else dag.dagrun_timeout.total_seconds()
        ),
        tags=tuple(str(tag) for tag in dag.tags),
        params=_param_specs(dag),
        doc_md=dag.doc_md,
        display_name=dag.dag_display_name,
        is_paused_upon_creation=dag.is_paused_upon_creation,
        has_on_success_callback=bool(dag.on_success_callback),
        has_on_failure_callback=bool(dag.on_failure_callback),
        deadline_alerts=tuple(alert.serialize() for alert in dag.deadline),
    )


def _names(items: Iterable[object], kind: type[Asset] | type[AssetAlias]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item.name for item in items if isinstance(item, kind)))


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _param_specs(dag: DAG) -> dict[str, Any] | None:
    """Each param's default and schema as JSON (a default that is not JSON as its repr)."""
    if not dag.params:
        return None
    out: dict[str, Any] = {}
    for name, param in dag.params.items():
        spec = param_spec(param)
        try:
            out[name] = json.loads(json.dumps(spec, allow_nan=False))
        except (TypeError, ValueError):
            spec["value"] = repr(param.value)
            spec["schema"] = {}  # not checkable as stored: the task checks the real value
            out[name] = json.loads(json.dumps(spec, default=repr))
    return out


def _describe_watcher(fileloc: str, asset: Asset, watcher: AssetWatcher) -> ParsedWatcher:
    where = f"{fileloc}: asset {asset.name!r} watcher {watcher.name!r}"
    watcher.check(asset.name, where=fileloc)
    cls = type(watcher.trigger)
    if cls.__module__.startswith(DAG_MODULE_PREFIX) or cls.__module__ == "__main__":
        raise DagDefinitionError(
            f"{where}: trigger class {cls.__qualname__} is defined in the DAG file; the "
            "triggerer imports trigger classes by module path: move it to a module in the "
            "plugins folder or to an installed package"
        )
    try:
        classpath, kwargs = watcher.trigger.serialize()
        text = dumps_kwargs(kwargs, owner=classpath)
    except (TypeError, ValueError) as exc:
        raise DagDefinitionError(f"{where}: cannot serialize the trigger: {exc}") from exc
    digest = trigger_stream_digest(watcher.trigger, strict=False)
    return ParsedWatcher(name=watcher.name, classpath=classpath, kwargs=text, stream_digest=digest)


def _file_assets(module: ModuleType, dags: Iterable[DAG]) -> list[Asset]:
    assets = [v for v in vars(module).values() if isinstance(v, Asset)]
    for dag in dags:
        if dag.schedule is not None:
            assets.extend(dag.schedule.iter_assets())
        for task in dag.tasks:
            assets.extend(a for a in (*task.outlets, *task.inlets) if isinstance(a, Asset))
    return assets


def describe_assets(fileloc: str, assets: Sequence[Asset]) -> list[ParsedAsset]:
    """One entry per asset name; watchers of every declaration merged, conflicts refused."""
    merged: dict[str, tuple[Asset, dict[str, ParsedWatcher]]] = {}
    for asset in assets:
        first, watchers = merged.setdefault(asset.name, (asset, {}))
        if first.uri != asset.uri:
            raise DagDefinitionError(
                f"{fileloc}: asset {asset.name!r} is declared with two uris, {first.uri!r} and "
                f"{asset.uri!r}; declare it once and reuse the object"
            )
        for watcher in asset.watchers:
            parsed = _describe_watcher(fileloc, asset, watcher)
            if watchers.setdefault(watcher.name, parsed) != parsed:
                raise DagDefinitionError(
                    f"{fileloc}: asset {asset.name!r} has two different watchers named "
                    f"{watcher.name!r}; declare the asset once and reuse the object"
                )
    return [
        ParsedAsset(
            name=name,
            uri=asset.uri,
            extra=asset.extra,
            watchers=tuple(sorted(watchers.values(), key=lambda w: w.name)),
        )
        for name, (asset, watchers) in sorted(merged.items())
    ]


def error_from_exception(exc: BaseException, fileloc: str) -> ParseError:
    """The error to store for ``fileloc``, with the line in that file where it happened."""
    lineno = getattr(exc, "lineno", None) if isinstance(exc, DagDefinitionError) else None
    if isinstance(exc, SyntaxError) and exc.filename == fileloc:
        lineno = exc.lineno
    elif lineno is None:
        for frame, line in traceback.walk_tb(exc.__traceback__):
            if frame.f_code.co_filename == fileloc:
                lineno = line
    text = "".join(traceback.format_exception(exc))[-TRACEBACK_MAX_CHARS:]
    message = str(exc) or repr(exc)
    return ParseError(type=type(exc).__name__, message=message, lineno=lineno, traceback=text)


def parse_file(path: Path) -> FileParseResult:
    """Import ``path`` and describe it; any failure of the file becomes ``error``."""
    fileloc = str(path)
    take_registered_dags()
    try:
        data = path.read_bytes()
        source = decode_source(data)
        module = import_dag_file(path, source=source)
        dags = collect_dags(module, fileloc)
        parsed_dags = tuple(describe_dag(dag) for dag in dags)
        assets = tuple(describe_assets(fileloc, _file_assets(module, dags)))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the boundary around user code
        return FileParseResult(fileloc=fileloc, error=error_from_exception(exc, fileloc))
    return FileParseResult(
        fileloc=fileloc,
        dags=parsed_dags,
        assets=assets,
        source_sha256=source_digest(data),
        source=source,
    )


def mark_imports() -> str:
    """Put a marker module in ``sys.modules`` (its key is returned): the modules imported
    after it come after it in the dict (``folder_imports(since=...)``)."""
    name = f"_sluice_imports_mark_{os.getpid()}"
    sys.modules[name] = ModuleType(name, "marks where a DAG file's imports start")
    return name


def _imported_since(mark: str) -> list[object] | None:
    """The entries of ``sys.modules`` added after ``mark`` (None when it is gone or the dict
    changed meanwhile: look at all of them)."""
    if mark not in sys.modules:
        return None
    found: list[object] = []
    try:
        for name in reversed(sys.modules):
            if name == mark:
                return found
            found.append(sys.modules[name])
    except (RuntimeError, KeyError):  # changed meanwhile (a thread of the file importing)
        return None
    return None


def folder_imports(
    fileloc: str, folders: Iterable[Path | None], *, since: str | None = None
) -> tuple[str, ...]:
    """The files of the modules under ``folders`` that are imported now, but ``fileloc``;
    with ``since`` (``mark_imports()``'s key), only those imported after it are looked at:
    the engine's own modules are not (in a child forked from the parse runner, reading each
    one would copy its memory page: ~500 page copies, a millisecond and more a file)."""
    roots = tuple(os.path.join(os.path.abspath(f), "") for f in folders if f is not None)
    if not roots:
        return ()
    modules = None if since is None else _imported_since(since)
    if modules is None:
        modules = list(sys.modules.values())
    found = set()
    for module in modules:
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.startswith(roots) and path != fileloc:
            found.add(path)
    return tuple(sorted(found))


def mask_result(result: FileParseResult, secrets: Iterable[str]) -> FileParseResult:
    """``result`` with ``secrets`` (what the file read at parse time) masked in its error."""
    error = result.error
    redactor = Redactor(secrets)
    if error is None or not redactor:
        return result
    trace = None if error.traceback is None else redactor.text(error.traceback)
    masked = replace(error, message=redactor.text(error.message), traceback=trace)
    return replace(result, error=masked)


@cache
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.dag_processing.parsing")
    parser.add_argument("--dags-folder", type=Path)
    parser.add_argument("--plugins-folder", type=Path)
    parser.add_argument(
        "--dump-stack-at",
        type=float,
        help="the time (Unix seconds) at which to print every thread's stack to stderr (shows "
        "where a file hangs before the parent kills this process; a moment, not a delay, so "
        "that the time this process took to start counts)",
    )
    parser.add_argument(
        "--request-fd",
        type=int,
        help="the socket on which the DAG processor answers the file's top-level "
        "Variable.get / Connection.get (engine.dag_processing.parse_store)",
    )
    parser.add_argument("file", type=Path)
    return parser


def prime() -> None:
    """Build the argument parser and use it once, as the parse runner does before it forks
    (each child then reads its arguments with it ready, its regular expressions compiled:
    building it costs a child ~1.5 ms, most of it in copied memory pages)."""
    _parser().parse_args(["--dags-folder", "dags", "--dump-stack-at", "0", "--", "file.py"])


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    store = None
    if args.request_fd is not None:
        os.set_inheritable(args.request_fd, False)  # not for processes the DAG file starts
        store = ParseTimeStore.from_fd(args.request_fd)
    install_store(store)
    result_fd = os.dup(1)
    os.dup2(2, 1)  # what the DAG file prints goes to stderr; stdout carries the result
    if args.dump_stack_at:
        delay = max(args.dump_stack_at - time.time(), MIN_DUMP_DELAY_S)
        faulthandler.dump_traceback_later(delay, exit=False)
    add_import_paths(args.dags_folder, args.plugins_folder)
    mark = mark_imports()
    try:
        result = parse_file(args.file)
        folders = (args.dags_folder, args.plugins_folder)
        result = replace(result, imports=folder_imports(str(args.file), folders, since=mark))
    finally:
        sys.modules.pop(mark, None)
        faulthandler.cancel_dump_traceback_later()
        if store is not None:
            store.close()
    if store is not None:
        result = mask_result(result, store.secrets)
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        out.write(result.to_json())
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads a DAG file started must not keep the child alive
