"""What the executor sends a task process: the ``TaskSpec`` of a claimed try.

``build_spec`` turns a claimed try (``engine.db.queries.tasks.TaskRun``) into the spec; its
context is the plain data ``build_context`` makes of the run (the keys
``engine.execution.context`` documents, which the task process hydrates into what the task
sees); ``with_results`` adds the results of the run's finished tasks and the size limit of
the task's own. The wire format itself is ``engine.execution.protocol``.

A task's spec carries no triggering asset events: the task's process asks for them over its
request channel when it first reads ``triggering_asset_events``
(``engine.executor.event_requests``), so a try whose task never reads them costs the
executor no read, decode or encode of them. A DAG callback's context carries them (one
process per run, built from ``engine.db.queries.callbacks.load_callback_run``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.authoring.context import DEFAULT_DEFERRABLE_KEY, TRIGGERING_ASSET_EVENTS_KEY
from engine.execution.protocol import TaskSpec
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value, dumps

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from engine.db.queries.assets import EventRow
    from engine.db.queries.tasks import TaskRun


def build_spec(
    run: TaskRun, *, dags_folder: Path, plugins_folder: Path | None, default_deferrable: bool
) -> TaskSpec:
    context = build_context(
        dag_id=run.dag_id,
        run_id=run.run_id,
        task_id=run.task_id,
        try_number=run.try_number,
        events=None,  # read by the task's process when it needs them
        default_deferrable=default_deferrable,
        run=run.run,
        inlet_events=run.inlet_events,
        map_index=run.map_index,
    )
    return TaskSpec(
        ti_id=run.ti_id,
        dag_id=run.dag_id,
        run_id=run.run_id,
        task_id=run.task_id,
        fileloc=run.fileloc,
        try_number=run.try_number,
        try_started_at=run.try_started_at.isoformat(),
        context=dumps(context, where="the task context"),
        next_method=run.next_method,
        next_kwargs=run.next_kwargs,
        deferral_count=run.deferral_count,
        dags_folder=str(dags_folder),
        plugins_folder=None if plugins_folder is None else str(plugins_folder),
        max_tries=run.max_tries,
    )


def event_dict(event: EventRow) -> dict[str, Any]:
    """An asset event as the task context carries it (``engine.authoring`` hydrates it)."""
    try:
        payload = deserialize_value(event.payload)
    except SerializationError:
        payload = event.payload  # stored by another program: hand it over as it is
    return event_fields(event, payload=payload, timestamp=event.timestamp)


def event_fields(event: EventRow, *, payload: Any, timestamp: Any) -> dict[str, Any]:
    """The keys of an event in a task's context, with ``payload`` and ``timestamp`` as the
    caller carries them (decoded, or as stored for the request channel)."""
    return {
        "id": event.id,
        "asset": event.asset_name,
        "uri": event.uri or event.asset_name,
        "extra": dict(event.extra or {}),
        "payload": payload,
        "timestamp": timestamp,
        "source": event.source,
        "source_watcher": event.source_watcher,
        "source_dag_id": event.source_dag_id,
        "source_run_id": event.source_run_id,
        "source_task_id": event.source_task_id,
        "source_try_number": event.source_try_number,
        "source_alias": event.source_alias,
        "created_by": event.created_by,
        "partition_key": event.partition_key,
    }


def build_context(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int,
    events: Sequence[EventRow] | None,
    default_deferrable: bool,
    run: Mapping[str, Any] | None = None,
    inlet_events: Mapping[str, Sequence[EventRow]] | None = None,
    map_index: int = -1,
) -> dict[str, Any]:
    """The raw task context the executor sends (keys documented in ``engine.authoring``);
    ``events`` in id order (None: no ``triggering_asset_events`` key, which the task's
    process then reads over its request channel). The child hydrates it
    (``hydrate_context``) into what tasks see."""
    context = {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "try_number": try_number,
        "map_index": map_index,
        "run": {"run_id": run_id, **(run or {})},
        "inlet_events": {
            name: [event_dict(e) for e in sorted(rows, key=lambda e: e.id)]
            for name, rows in (inlet_events or {}).items()
        },
        DEFAULT_DEFERRABLE_KEY: default_deferrable,
    }
    if events is not None:
        triggering: dict[str, list[dict[str, Any]]] = {}
        for event in sorted(events, key=lambda e: e.id):
            triggering.setdefault(event.asset_name, []).append(event_dict(event))
        context[TRIGGERING_ASSET_EVENTS_KEY] = triggering
    return context


def with_results(
    spec: TaskSpec,
    results: Mapping[str, Mapping[str, Any]],
    *,
    max_bytes: int | None,
    mapped: Mapping[str, Mapping[str, Any]] | None = None,
) -> TaskSpec:
    """``spec`` carrying the run's results (``{task_id: {key: tagged JSON}}``; ``mapped``:
    those of mapped tasks' copies, ``{task_id: {map_index: {key: tagged JSON}}}``) and the
    size limit of the task's own."""
    text = json.dumps(results, separators=(",", ":")) if results else None
    mapped_text = json.dumps(mapped, separators=(",", ":")) if mapped else None
    return replace(spec, xcoms=text, max_xcom_size_bytes=max_bytes, mapped_xcoms=mapped_text)
