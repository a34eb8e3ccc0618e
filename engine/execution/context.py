"""What a running task sees: the context built from the executor's plain data, and the
asset events it reports when it succeeds.

The executor sends plain data (tagged JSON); ``hydrate_context(raw, task)`` builds the
context the task gets (``execute(context)``; a ``@task`` function's parameters by name).
Raw keys: ``dag_id``, ``task_id``, ``run_id``, ``try_number``, ``map_index`` (-1),
``default_deferrable``, ``triggering_asset_events`` and ``inlet_events`` (``{asset name:
[event dict, ...]}``, oldest first), and ``run``: ``{run_id, run_type, logical_date,
data_interval_start, data_interval_end, run_after, conf, queued_at, start_date}``. An
event dict holds ``id``, ``asset`` (the name), ``uri``, ``extra``, ``payload``,
``timestamp``, ``source`` (``watcher`` / ``task`` / ``cli`` / ``api``), ``source_watcher``,
``source_dag_id``, ``source_run_id``, ``source_task_id``, ``source_try_number``,
``source_alias`` (the alias an event was attached through) and ``created_by``; missing keys
read as None. ``xcoms``: the results of the run's finished tasks, ``{task_id: {key: tagged
JSON value}}``, decoded when pulled; ``mapped_xcoms``: those of mapped tasks' copies,
``{task_id: {map_index: {key: tagged JSON value}}}``.

The context holds every raw key plus:

- ``ti`` / ``task_instance`` (``dag_id``, ``task_id``, ``run_id``, ``try_number``,
  ``map_index``, ``task``; ``xcom_pull`` reads the run's results, ``xcom_push`` adds one of
  this task's, stored when the try succeeds), ``task``, ``dag``, ``dag_run`` (``run_id``,
  ``run_type``, ``logical_date``, ``data_interval_start`` / ``_end``, ``run_after``,
  ``conf``, ``queued_at``, ``start_date``, ``dag_id``);
- ``params``: the DAG's params, the task's over them, the run's ``conf`` over those, each
  checked by its ``Param`` (``ParamValidationError`` fails the task);
- ``logical_date``, ``data_interval_start``, ``data_interval_end``, ``run_after``, and
  ``ds``, ``ds_nodash``, ``ts``, ``ts_nodash``, ``ts_nodash_with_tz`` from the logical date
  in UTC (all None for a run without one, such as an asset-triggered run);
- ``triggering_asset_events`` and ``inlet_events``: ``{asset name: [AssetEvent, ...]}``
  that also take an ``Asset`` or ``AssetAlias`` as key; an ``AssetEvent`` reads by item and
  by attribute (``e["payload"]``, ``e.extra``, ``e.asset.name``, ``e.source_dag_id``);
- ``outlet_events``: ``outlet_events[asset].extra`` is the extra of the event the task
  writes for an outlet; ``outlet_events[alias].add(Asset(...), extra={...})`` attaches an
  event to an asset through an alias in the task's outlets;
- ``inlets`` and ``outlets``: the task's.

Datetimes are pendulum ``DateTime`` in UTC when pendulum is installed (as Airflow gives
them), else aware stdlib datetimes. ``collect_outlet_events`` turns what the task set (and
the ``Metadata`` it yielded or returned) into the events to write.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import Asset, AssetAlias, Metadata
from engine.authoring.params import resolve_params
from engine.authoring.variables import ConnectionAccessor, VariableAccessors
from engine.authoring.xcom import XCOM_RETURN_KEY
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value, serialize_value

if TYPE_CHECKING:
    from types import ModuleType

    from engine.authoring.baseoperator import BaseOperator

EVENT_KEYS: Final = (
    "id",
    "asset",
    "uri",
    "extra",
    "payload",
    "timestamp",
    "source",
    "source_watcher",
    "source_dag_id",
    "source_run_id",
    "source_task_id",
    "source_try_number",
    "source_alias",
    "created_by",
)
_DATE_KEYS: Final = ("ds", "ds_nodash", "ts", "ts_nodash", "ts_nodash_with_tz")


@functools.cache
def _pendulum() -> ModuleType | None:
    try:
        import pendulum  # optional; only a running task pays for it
    except ImportError:  # pragma: no cover - pendulum is an optional extra
        return None
    return pendulum


def as_moment(value: object) -> datetime | None:
    """An aware UTC datetime (pendulum's when installed); naive values are read as UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {value!r}")
    moment = value.replace(tzinfo=UTC) if value.utcoffset() is None else value.astimezone(UTC)
    pendulum = _pendulum()
    if pendulum is None:
        return moment
    converted: datetime = pendulum.instance(moment, tz="UTC")
    return converted


def date_strings(logical_date: datetime | None) -> dict[str, str | None]:
    """``ds``, ``ds_nodash``, ``ts``, ``ts_nodash`` and ``ts_nodash_with_tz`` (UTC)."""
    if logical_date is None:
        return dict.fromkeys(_DATE_KEYS)
    utc = logical_date.astimezone(UTC)
    ds, ts = utc.strftime("%Y-%m-%d"), utc.isoformat()
    return {
        "ds": ds,
        "ds_nodash": ds.replace("-", ""),
        "ts": ts,
        "ts_nodash": utc.strftime("%Y%m%dT%H%M%S"),
        "ts_nodash_with_tz": ts.replace("-", "").replace(":", ""),
    }


# --- views ------------------------------------------------------------------------------------


class AttributeDict(dict[str, Any]):
    """A dict whose keys also read as attributes (``e.extra`` is ``e["extra"]``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}") from None


class AssetEvent(AttributeDict):
    """One asset event as a task sees it; ``asset`` has ``name`` and ``uri``."""

    __slots__ = ()


def _event_view(asset_name: str, raw: object) -> AssetEvent:
    if not isinstance(raw, Mapping):
        raise TypeError(f"an asset event of {asset_name!r} must be a mapping, got {raw!r}")
    data: dict[str, Any] = dict.fromkeys(EVENT_KEYS)
    data.update(raw)
    name = data["asset"] if isinstance(data["asset"], str) else asset_name
    data["uri"] = data["uri"] or name
    data["asset"] = AttributeDict(name=name, uri=data["uri"])
    data["extra"] = dict(data["extra"] or {})
    data["timestamp"] = as_moment(data["timestamp"])
    return AssetEvent(data)


def _name_of(key: object) -> str:
    if isinstance(key, Asset | AssetAlias):
        return key.name
    if isinstance(key, str):
        return key
    raise TypeError(f"asset events are looked up by Asset, AssetAlias or name, got {key!r}")


class AssetEvents(dict[str, list[AssetEvent]]):
    """``{asset name: [AssetEvent, ...]}`` that also takes an ``Asset`` or alias as key."""

    __slots__ = ()

    @classmethod
    def from_raw(cls, raw: object) -> AssetEvents:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise TypeError(f"asset events must be a mapping of names to lists, got {raw!r}")
        return cls({name: [_event_view(name, event) for event in raw[name]] for name in raw})

    def __getitem__(self, key: object) -> list[AssetEvent]:
        return super().__getitem__(_name_of(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(_name_of(key))

    def get(self, key: object, default: Any = None) -> Any:
        return super().get(_name_of(key), default)


class InletEvents(AssetEvents):
    """``inlet_events``: an inlet of the task without events gives ``[]``."""

    __slots__ = ("_inlets", "_task_id")

    def __init__(self, events: Mapping[str, list[AssetEvent]], task: BaseOperator) -> None:
        super().__init__(events)
        self._inlets = {item.name for item in task.inlets}
        self._task_id = task.task_id

    def __missing__(self, name: str) -> list[AssetEvent]:
        if name in self._inlets:
            return []
        raise KeyError(
            f"task {self._task_id!r}: {name!r} is not one of its inlets {sorted(self._inlets)}; "
            "add it to inlets=[...] to read its events"
        )


@dataclass(frozen=True, slots=True)
class DagRun:
    """The run a task belongs to (``context["dag_run"]``)."""

    dag_id: str | None
    run_id: str | None
    run_type: str | None = None
    logical_date: datetime | None = None
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    run_after: datetime | None = None
    conf: dict[str, Any] = field(default_factory=dict)
    queued_at: datetime | None = None
    start_date: datetime | None = None


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
        """What this try pushed so far: ``{key: tagged JSON}`` (stored if it succeeds)."""
        return dict(self._pushed)

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
        """Results of this run's tasks (Airflow 3's semantics).

        ``task_ids`` None is this task; a str gives one value, a list gives a list (one per
        task and map index, ``default`` where a task stored nothing under ``key``).
        ``map_indexes`` None is the unmapped task, or every copy of a mapped task (a list of
        the copies' values by ``map_index``, as Airflow's lazy sequence); an int is one copy
        (-1: the unmapped task). Results of another DAG or run are not available yet: asking
        for them is a ``NotImplementedError``.
        """
        self._check_scope(dag_id, run_id, include_prior_dates)
        if not isinstance(key, str):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() key must be a str, got {key!r}")
        ids = [self.task_id] if task_ids is None else _as_list(task_ids, "task_ids")
        indexes = [map_indexes] if map_indexes is None else _as_list(map_indexes, "map_indexes")
        values = [self._lookup(tid, index, key, default) for tid in ids for index in indexes]
        single = (task_ids is None or isinstance(task_ids, str)) and (
            map_indexes is None or isinstance(map_indexes, int)
        )
        return values[0] if single else values

    def _check_scope(self, dag_id: str | None, run_id: str | None, prior: bool) -> None:
        where = f"task {self.task_id!r}: xcom_pull()"
        if dag_id is not None and dag_id != self.dag_id:
            raise NotImplementedError(
                f"{where} from DAG {dag_id!r}: only results of this DAG's run can be pulled "
                "yet; share data across DAGs through assets (outlet_events extra)"
            )
        if run_id is not None and run_id != self.run_id:
            raise NotImplementedError(
                f"{where} from run {run_id!r}: only results of this run can be pulled yet"
            )
        if prior:
            raise NotImplementedError(
                f"{where}: include_prior_dates=True is not supported yet (results of this run only)"
            )

    def _lookup(self, task_id: object, map_index: object, key: str, default: Any) -> Any:
        if not isinstance(task_id, str):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() task ids are str, got {task_id!r}")
        if map_index is not None and not isinstance(map_index, int):
            raise TypeError(f"task {self.task_id!r}: xcom_pull() map indexes are int")
        own = task_id == self.task_id and map_index in (None, self.map_index)
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


# --- outlet events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssetAliasEvent:
    """An event attached to ``asset`` through the alias ``source_alias_name``."""

    source_alias_name: str
    asset_name: str
    asset_uri: str
    extra: dict[str, Any]


class OutletEventAccessor:
    """``outlet_events[key]``: ``extra`` for an asset; ``add(asset, extra)`` for an alias."""

    def __init__(self, key: Asset | AssetAlias, owner: OutletEventAccessors) -> None:
        self.key = key
        self._extra: dict[str, Any] = {}
        self.asset_alias_events: list[AssetAliasEvent] = []
        self._owner = owner

    @property
    def extra(self) -> dict[str, Any]:
        """The extra of the event written for this outlet (fill it, or assign a dict)."""
        return self._extra

    @extra.setter
    def extra(self, value: Mapping[str, Any]) -> None:
        if not isinstance(value, Mapping):
            raise TypeError(
                f"outlet_events[{self.key!r}].extra must be a dict, got {type(value).__name__}"
            )
        self._extra = value if isinstance(value, dict) else dict(value)

    def __repr__(self) -> str:
        return f"<OutletEventAccessor {self.key!r} extra={self.extra!r}>"

    def add(self, asset: Asset | str, extra: Mapping[str, Any] | None = None) -> None:
        """Attach an event for ``asset`` through this alias (an alias in the task's outlets)."""
        alias = self.key
        if not isinstance(alias, AssetAlias):
            raise TypeError(
                f"outlet_events[{alias!r}].add(): add() attaches events through an "
                "AssetAlias; for an asset, set .extra"
            )
        self._owner.check_alias(alias.name)
        target = self._owner.asset_named(asset)
        if extra is not None and not isinstance(extra, Mapping):
            raise TypeError(f"outlet_events[{alias!r}].add(): extra must be a dict, got {extra!r}")
        event = AssetAliasEvent(alias.name, target.name, target.uri, dict(extra or {}))
        if event not in self.asset_alias_events:
            self.asset_alias_events.append(event)


class OutletEventAccessors:
    """``outlet_events``: one accessor per asset or alias, created on first use."""

    def __init__(self, task: BaseOperator | None = None) -> None:
        outlets = task.outlets if task is not None else []
        self._task_id = task.task_id if task is not None else None
        self._assets = {item.name: item for item in outlets if isinstance(item, Asset)}
        self._aliases = {item.name for item in outlets if isinstance(item, AssetAlias)}
        self._by_asset: dict[str, OutletEventAccessor] = {}
        self._by_alias: dict[str, OutletEventAccessor] = {}

    def __repr__(self) -> str:
        return (
            f"<OutletEventAccessors assets={list(self._by_asset)} aliases={list(self._by_alias)}>"
        )

    def __getitem__(self, key: Asset | AssetAlias | str) -> OutletEventAccessor:
        if isinstance(key, AssetAlias) or (
            isinstance(key, str) and key in self._aliases and key not in self._assets
        ):
            name = _name_of(key)
            alias = key if isinstance(key, AssetAlias) else AssetAlias(name)
            return self._by_alias.setdefault(name, OutletEventAccessor(alias, self))
        asset = self.asset_named(key)
        return self._by_asset.setdefault(asset.name, OutletEventAccessor(asset, self))

    def asset_named(self, key: object) -> Asset:
        """The outlet asset named ``key`` (an ``Asset`` is taken as it is)."""
        if isinstance(key, Asset):
            return key
        if not isinstance(key, str):
            raise TypeError(f"outlet_events takes an Asset, an AssetAlias or a name, got {key!r}")
        return self._assets.get(key) or Asset(key)

    def check_alias(self, name: str) -> None:
        if name not in self._aliases:
            raise ValueError(
                f"task {self._task_id!r}: AssetAlias {name!r} is not in its outlets; add it to "
                "outlets=[...] to attach events through it"
            )

    def extra_of(self, asset_name: str) -> dict[str, Any]:
        accessor = self._by_asset.get(asset_name)
        return {} if accessor is None else accessor.extra

    def alias_events(self) -> list[AssetAliasEvent]:
        return [event for item in self._by_alias.values() for event in item.asset_alias_events]

    def apply(self, metadata: Metadata) -> None:
        """What yielding or returning ``metadata`` does (as in Airflow)."""
        self[metadata.asset].extra.update(metadata.extra)
        alias = metadata.alias
        if alias is not None:
            self[alias if isinstance(alias, AssetAlias) else AssetAlias(alias)].add(
                metadata.asset, extra=metadata.extra
            )


def outlet_events_of(context: dict[str, Any], task: BaseOperator) -> OutletEventAccessors:
    """The context's ``outlet_events`` (created when a plain dict has none)."""
    accessors = context.get("outlet_events")
    if not isinstance(accessors, OutletEventAccessors):
        accessors = OutletEventAccessors(task)
        context["outlet_events"] = accessors
    return accessors


def _plain_extra(task: BaseOperator, asset_name: str, extra: object) -> dict[str, Any]:
    what = f"task {task.task_id!r}: the extra of its event for asset {asset_name!r}"
    if not isinstance(extra, Mapping):
        raise TypeError(f"{what} must be a dict, got {type(extra).__name__}")
    if not all(isinstance(key, str) for key in extra):
        raise TypeError(f"{what} must have string keys, got {list(extra)!r}")
    try:
        plain: dict[str, Any] = json.loads(json.dumps(dict(extra), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON: {exc}") from exc
    return plain


def is_metadata_result(returned: object) -> bool:
    """True when a task returned ``Metadata`` (one or a list): outlet extras, not a result."""
    return bool(_returned_metadata(returned))


def _returned_metadata(returned: object) -> list[Metadata]:
    if isinstance(returned, Metadata):
        return [returned]
    if isinstance(returned, list | tuple) and returned:
        if all(isinstance(item, Metadata) for item in returned):
            return list(returned)
    return []


def collect_outlet_events(
    context: dict[str, Any], task: BaseOperator, returned: object = None
) -> list[dict[str, Any]]:
    """The asset events a successful task writes: ``{"asset", "uri", "extra", "alias"}``.

    One per ``Asset`` in ``task.outlets`` (its extra from ``outlet_events``, ``{}`` by
    default), then one per event attached through an alias. ``Metadata`` the task returned
    (``returned``: one, or a list of them) is applied first. An extra that is not JSON is a
    ``TypeError`` naming the task and the asset.
    """
    accessors = outlet_events_of(context, task)
    for metadata in _returned_metadata(returned):
        accessors.apply(metadata)
    events = [
        {
            "asset": outlet.name,
            "uri": outlet.uri,
            "extra": _plain_extra(task, outlet.name, accessors.extra_of(outlet.name)),
            "alias": None,
        }
        for outlet in task.outlets
        if isinstance(outlet, Asset)
    ]
    for event in accessors.alias_events():
        extra = _plain_extra(task, event.asset_name, event.extra)
        events.append(
            {
                "asset": event.asset_name,
                "uri": event.asset_uri,
                "extra": extra,
                "alias": event.source_alias_name,
            }
        )
    return events


# --- the context ----------------------------------------------------------------------------


def _dag_run(raw: Mapping[str, Any], task: BaseOperator) -> DagRun:
    run = raw.get("run") or {}
    if not isinstance(run, Mapping):
        raise TypeError(f"context['run'] must be a mapping, got {run!r}")
    conf = run.get("conf") or {}
    if not isinstance(conf, Mapping):
        raise TypeError(f"the run's conf must be a mapping, got {conf!r}")
    return DagRun(
        dag_id=raw.get("dag_id") or (task.dag.dag_id if task.dag is not None else None),
        run_id=run.get("run_id", raw.get("run_id")),
        run_type=run.get("run_type"),
        logical_date=as_moment(run.get("logical_date")),
        data_interval_start=as_moment(run.get("data_interval_start")),
        data_interval_end=as_moment(run.get("data_interval_end")),
        run_after=as_moment(run.get("run_after")),
        conf=dict(conf),
        queued_at=as_moment(run.get("queued_at")),
        start_date=as_moment(run.get("start_date")),
    )


def _results(raw: object) -> dict[str, Mapping[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise TypeError(f"context['xcoms'] must map task ids to {{key: value}}, got {raw!r}")
    return dict(raw)


def _mapped_results(raw: object) -> dict[str, dict[int, Mapping[str, Any]]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TypeError(f"context['mapped_xcoms'] must be a mapping, got {raw!r}")
    return {
        str(task_id): {int(index): values for index, values in copies.items()}
        for task_id, copies in raw.items()
    }


#: the contexts of the task code running now, innermost last (``get_current_context``)
_running: list[dict[str, Any]] = []


@contextmanager
def running_with(context: dict[str, Any]) -> Iterator[None]:
    """Make ``context`` what ``get_current_context()`` returns while the task code runs."""
    _running.append(context)
    try:
        yield
    finally:
        _running.pop()


def get_current_context() -> dict[str, Any]:
    """The running task's context, as Airflow's ``get_current_context()``: for code deep
    inside a task that was not handed the context. Outside a running task it raises."""
    if not _running:
        raise RuntimeError(
            "get_current_context() was called outside a running task: the context exists "
            "only while a task's execute (or a @task function) runs"
        )
    return _running[-1]


def hydrate_context(raw: Mapping[str, Any], task: BaseOperator) -> dict[str, Any]:
    """The context ``task`` sees, from the plain data the executor sent (keys above).

    Raises ``ParamValidationError`` when a param's value (default or from the run's conf)
    fails its ``Param``: the task fails with it.
    """
    dag_run = _dag_run(raw, task)
    ti = RuntimeTaskInstance(
        dag_id=dag_run.dag_id,
        task_id=task.task_id,
        run_id=dag_run.run_id,
        try_number=int(raw.get("try_number", 1)),
        map_index=int(raw.get("map_index", -1)),
        task=task,
        results=_results(raw.get("xcoms")),
        mapped_results=_mapped_results(raw.get("mapped_xcoms")),
    )
    dag_params = task.dag.params if task.dag is not None else {}
    context = dict(raw)
    context.update(
        ti=ti,
        task_instance=ti,
        task=task,
        dag=task.dag,
        dag_run=dag_run,
        run_id=dag_run.run_id,
        map_index=ti.map_index,
        params=resolve_params(dag_params, task.params, dag_run.conf),
        logical_date=dag_run.logical_date,
        data_interval_start=dag_run.data_interval_start,
        data_interval_end=dag_run.data_interval_end,
        run_after=dag_run.run_after,
        **date_strings(dag_run.logical_date),
        triggering_asset_events=AssetEvents.from_raw(raw.get("triggering_asset_events")),
        inlet_events=InletEvents(AssetEvents.from_raw(raw.get("inlet_events")), task),
        outlet_events=OutletEventAccessors(task),
        inlets=list(task.inlets),
        outlets=list(task.outlets),
        var=VariableAccessors(),
        conn=ConnectionAccessor(),
    )
    if context["ds_nodash"] is not None:  # Airflow's, for runs with a logical date
        key = f"{dag_run.dag_id}__{task.task_id}__{context['ds_nodash']}"
        context["task_instance_key_str"] = key
    return context
