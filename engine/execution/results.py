"""The results of a run as a running task sees them, and the results it stores.

``context["ti"]`` is a ``RuntimeTaskInstance``: who the try is, the results of the run's
finished tasks (``xcom_pull``, Airflow 3's semantics: this run's, or another DAG's or run's
asked of the executor), the results
it adds (``xcom_push``, stored when the try succeeds), and template rendering for operators
that render at run time. On success ``collect_results`` gives what the try stores: what it
pushed, each key of a dict return value with ``multiple_outputs``, then ``return_value``,
each tagged JSON no larger than ``[core] max_xcom_size_bytes``. A task whose result a mapped
task maps over must return a list or a dict (``check_mappable_result``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from engine.authoring.baseoperator import MappedOperator
from engine.authoring.mapped_groups import group_task_ids_of
from engine.authoring.mapping import UnmappableXComTypePushed, XComForMappingNotPushed
from engine.authoring.operatorlink import operator_links
from engine.authoring.xcom import XCOM_RETURN_KEY
from engine.execution.remote_results import pull_remote
from engine.execution.templates import render_template
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value, serialize_value

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.baseoperator import BaseOperator


class RuntimeTaskInstance:
    """The try of the task that runs (``context["ti"]``): who it is, and the results of the
    run's finished tasks (``xcom_pull``) and its own (``xcom_push``)."""

    __slots__ = (
        "_mapped",
        "_pushed",
        "_results",
        "dag_id",
        "map_index",
        "run_id",
        "task",
        "task_id",
        "try_number",
    )

    def __init__(
        self,
        *,
        dag_id: str | None,
        task_id: str,
        run_id: str | None,
        try_number: int,
        map_index: int,
        task: BaseOperator,
        results: Mapping[str, Mapping[str, Any]] | None = None,
        mapped_results: Mapping[str, Mapping[int, Mapping[str, Any]]] | None = None,
    ) -> None:
        self.dag_id = dag_id
        self.task_id = task_id
        self.run_id = run_id
        self.try_number = try_number
        self.map_index = map_index
        self.task = task
        self._results = {name: dict(values) for name, values in (results or {}).items()}
        self._pushed: dict[str, Any] = {}
        #: results of mapped tasks' copies: {task_id: {map_index: {key: tagged JSON}}}
        self._mapped = {
            name: dict(sorted(copies.items())) for name, copies in (mapped_results or {}).items()
        }

    def __repr__(self) -> str:
        return (
            f"<TaskInstance {self.dag_id}.{self.task_id} run={self.run_id} try={self.try_number}"
            f" pushed={sorted(self._pushed)}>"
        )

    @property
    def pushed(self) -> dict[str, Any]:
        """What this try pushed so far: ``{key: tagged JSON}`` (stored if it succeeds or
        defers), over what it pushed before a deferral it resumed from."""
        kept: Mapping[str, Any]
        if self.map_index < 0:
            kept = self._results.get(self.task_id, {})
        else:
            kept = self._mapped.get(self.task_id, {}).get(self.map_index, {})
        return {**kept, **self._pushed}

    def render_template(
        self, value: Any, context: Mapping[str, Any], *, template_ext: Sequence[str] = ()
    ) -> Any:
        """``value`` rendered as this task's templates are (``@task.bash`` renders the
        command its function returned); a str ending with one of ``template_ext`` names a
        template file next to the DAG file."""
        return render_template(value, context, task=self.task, template_ext=template_ext)

    def xcom_push(self, key: str, value: Any) -> None:
        """Publish ``value`` as this task's result ``key`` (stored when the try succeeds).

        ``value`` must be storable: JSON data, or the types of ``triggers.serde``
        (datetimes, tuples, sets, bytes ...); anything else is a ``TypeError`` here.
        """
        if not isinstance(key, str) or not key:
            raise TypeError(f"task {self.task_id!r}: xcom_push() key must be a non-empty str")
        self._pushed[key] = encode_result(value, task_id=self.task_id, key=key)

    def xcom_pull(
        self,
        task_ids: str | Iterable[str] | None = None,
        dag_id: str | None = None,
        key: str = XCOM_RETURN_KEY,
        include_prior_dates: bool = False,
        *,
        map_indexes: int | Iterable[int] | None = None,
        default: Any = None,
        run_id: str | None = None,
    ) -> Any:
        """Results of tasks (Airflow 3's semantics): of this run by default.

        ``task_ids`` None is this task; a str gives one value, a list gives a list (one per
        task and map index, ``default`` where a task stored nothing under ``key``).
        ``map_indexes`` None is the unmapped task, or every copy of a mapped task (a list of
        the copies' values by ``map_index``, as Airflow's lazy sequence), but this task's
        own copy of another task of its mapped task group; an int is one copy (-1: the
        unmapped task). ``dag_id`` / ``run_id`` (None: this task's) read another
        DAG's or run's results, ``include_prior_dates=True`` the latest run at or before
        this one that stored ``key``: asked of the executor
        (``engine.execution.remote_results``).
        """
        if not isinstance(key, str):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() key must be a str, got {key!r}")
        ids = [self.task_id] if task_ids is None else _as_list(task_ids, "task_ids")
        indexes = [map_indexes] if map_indexes is None else _as_list(map_indexes, "map_indexes")
        remote = include_prior_dates or dag_id not in (None, self.dag_id)
        remote = remote or run_id not in (None, self.run_id)
        lookup = self._lookup
        if remote:
            lookup = functools.partial(
                self._lookup_remote,
                dag_id=dag_id or self.dag_id,
                run_id=run_id or self.run_id,
                prior=bool(include_prior_dates),
            )
        values = [lookup(tid, index, key, default) for tid in ids for index in indexes]
        single = (task_ids is None or isinstance(task_ids, str)) and (
            map_indexes is None or isinstance(map_indexes, int)
        )
        return values[0] if single else values

    def _lookup_remote(
        self,
        task_id: object,
        map_index: object,
        key: str,
        default: Any,
        *,
        dag_id: str | None,
        run_id: str | None,
        prior: bool,
    ) -> Any:
        if not isinstance(task_id, str):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() task ids are str, got {task_id!r}")
        if map_index is not None and not isinstance(map_index, int):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() map indexes are int")
        if dag_id is None or run_id is None:
            raise TypeError(f"task {self.task_id!r}: xcom_pull() needs a dag_id and a run_id here")
        return pull_remote(
            asker=self.task_id,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            key=key,
            include_prior_dates=prior,
            default=default,
        )

    def _lookup(self, task_id: object, map_index: object, key: str, default: Any) -> Any:
        if not isinstance(task_id, str):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() task ids are str, got {task_id!r}")
        if map_index is not None and not isinstance(map_index, int):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() map indexes are int")
        own = task_id == self.task_id and map_index in (None, self.map_index)
        if map_index is None and not own and task_id in group_task_ids_of(self.task):
            map_index = self.map_index  # another task of its mapped group: the same copy
        copies = self._mapped.get(task_id)
        if copies is not None and map_index is None and not own:
            return [deserialize_value(c[key]) for c in copies.values() if key in c]
        if map_index is None or map_index == -1:
            stored = dict(self._results.get(task_id, {}))
        else:
            stored = dict((copies or {}).get(map_index, {}))
        if own:
            stored.update(self._pushed)
        if key not in stored:
            return default
        return deserialize_value(stored[key])


def _as_list(value: object, name: str) -> list[Any]:
    if isinstance(value, str | int):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, Mapping | bytes):
        return list(value)
    raise TypeError(f"xcom_pull(): {name} must be one value or a list of them, got {value!r}")


def encode_result(value: Any, *, task_id: str, key: str) -> Any:
    """``value`` as stored (tagged JSON); a ``TypeError`` naming the task, key and type when
    it cannot be stored."""
    what = "its return value" if key == XCOM_RETURN_KEY else f"its result {key!r}"
    try:
        return serialize_value(value, where="the value")
    except SerializationError as exc:
        raise TypeError(
            f"task {task_id!r}: {what} of type {type(value).__name__} cannot be stored as a "
            f"result: {exc}. "
            "Results are JSON data (dict, list, str, int, float, bool, None) or datetimes, "
            "dates, timedeltas, tuples, sets, bytes, decimals, UUIDs, paths; keep other objects "
            "elsewhere (a file, an object store) and return a reference to them"
        ) from exc


def result_size_error(task_id: str, key: str, size: int, limit: int) -> str:
    """Why a result over ``[core] max_xcom_size_bytes`` fails its task."""
    what = "its return value" if key == XCOM_RETURN_KEY else f"its result {key!r}"
    return (
        f"task {task_id!r}: {what} is {size:,} bytes of JSON, over [core] "
        f"max_xcom_size_bytes = {limit:,}; store the data elsewhere (a file, an object store) "
        "and return a reference to it (a path, a URL, an object key), or raise the limit"
    )


def collect_results(
    context: Mapping[str, Any], task: BaseOperator, value: Any, *, max_bytes: int | None
) -> dict[str, Any]:
    """The results a successful task stores (``{key: tagged JSON}``): what it pushed, then
    each key of a dict return value with ``multiple_outputs``, then ``return_value``.

    ``TypeError`` for a value that cannot be stored or a ``multiple_outputs`` result that is
    not a dict with str keys; ``ValueError`` for one over ``max_bytes``.
    """
    ti = context.get("ti")
    results = dict(ti.pushed) if isinstance(ti, RuntimeTaskInstance) else {}
    task_id = task.task_id
    for key, link in operator_links(task, ti).items():  # operator_extra_links (Airflow's)
        results[key] = encode_result(link, task_id=task_id, key=key)
    if value is not None and getattr(task, "do_xcom_push", True):
        if getattr(task, "multiple_outputs", False):
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise TypeError(
                    f"task {task_id!r} has multiple_outputs=True: it must return a dict with "
                    f"str keys, got {type(value).__name__}"
                    + (f" with keys {list(value)[:5]!r}" if isinstance(value, dict) else "")
                )
            for key, item in value.items():
                results[key] = encode_result(item, task_id=task_id, key=key)
        results[XCOM_RETURN_KEY] = encode_result(value, task_id=task_id, key=XCOM_RETURN_KEY)
    if max_bytes is not None:
        for key, encoded in results.items():
            size = len(json.dumps(encoded, separators=(",", ":")).encode("utf-8"))
            if size > max_bytes:
                raise ValueError(result_size_error(task_id, key, size, max_bytes))
    return results


def check_mappable_result(task: BaseOperator, value: Any) -> None:
    """Raise when a mapped task maps over ``task``'s return value and ``value`` cannot be
    mapped over (the task runner calls it before storing the result, as Airflow does)."""
    dag = task.dag
    if dag is None or isinstance(task, MappedOperator):
        return
    for child_id in task.downstream_task_ids:
        child = dag.task_dict.get(child_id)
        if not isinstance(child, MappedOperator):
            continue
        if not any(s.operator.task_id == task.task_id for s in child.iter_mapped_sources()):
            continue
        if value is None or not getattr(task, "do_xcom_push", True):
            raise XComForMappingNotPushed(task.task_id, for_task=child.task_id)
        if not isinstance(value, list | tuple | dict):
            raise UnmappableXComTypePushed(task.task_id, value, for_task=child.task_id)
