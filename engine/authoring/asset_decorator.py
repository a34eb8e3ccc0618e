"""``@asset`` and ``@asset.multi``: a function that materialises an asset (Airflow 3's).

::

    @asset(schedule="@daily", uri="s3://bucket/raw_orders")
    def raw_orders(self, context):
        ...  # writes the data; self is the asset (an Asset), context the task's context

    @asset(schedule=raw_orders)          # runs when raw_orders is updated
    def order_report(self, raw_orders):  # raw_orders: the upstream asset, read as an inlet
        events = get_current_context()["inlet_events"][raw_orders]

    @asset.multi(schedule="@hourly", outlets=[Asset("a"), Asset("b")])
    def a_and_b(): ...

Each decorated function becomes a DAG of one task, registered like ``with DAG(...)``: its
``dag_id`` is the asset's name (``@asset.multi``: the function's name), its one task (id:
the function's name) runs the function and has the asset (``@asset.multi``: the
``outlets``) as outlet, so a success updates it and starts what is scheduled on it. The
decorated name is the asset (an ``Asset``; ``@asset.multi``: the condition "all of its
outlets", an ``AssetAll``), usable in another DAG's ``schedule=``, ``outlets=`` or
``inlets=``.

Arguments: ``schedule`` (required: a cron string or preset, a timetable, assets or an asset
condition, None), ``name`` (default: the function's name), ``uri`` (default: the name),
``group``, ``extra``, ``watchers``, and the DAG's ``dag_id``, ``dag_display_name``,
``description``, ``params``, ``on_success_callback``, ``on_failure_callback``,
``is_paused_upon_creation``, ``tags`` (and ``access_control`` / ``owner_links``, which DAGs
ignore with a warning); ``catchup`` is False, as Airflow's. The function's
parameters, as Airflow reads them: ``self`` is the asset, ``context`` the task's context,
``outlet_events`` its outlet events; a parameter with a default gets its default; any other
name is an upstream asset of that name (the asset object of that name in the function's
module, else ``Asset(name)``), passed as the asset and declared as the task's inlet. ``*args``
/ ``**kwargs``, positional-only parameters without a default and nested functions are
refused, as Airflow does.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import DEFAULT_ASSET_GROUP, Asset, AssetAll, AssetWatcher, BaseAsset
from engine.authoring.dag import DAG
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.operators import PythonOperator

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence

    from engine.authoring.context import Context

#: parameter names that are not upstream assets
SELF: Final = "self"
RESERVED: Final = frozenset({SELF, "context", "outlet_events"})
_DAG_ARGUMENTS: Final = frozenset(
    {
        "dag_id",
        "dag_display_name",
        "description",
        "params",
        "on_success_callback",
        "on_failure_callback",
        "is_paused_upon_creation",
        "tags",
        "access_control",  # the DAG ignores these two with a warning, as for any DAG
        "owner_links",
    }
)


def _check_function(function: Any, where: str, kind: str) -> Callable[..., Any]:
    if not callable(function) or not hasattr(function, "__name__"):
        raise DagDefinitionError(f"{where}: {kind} decorates functions, got {function!r}")
    if function.__name__ != function.__qualname__:
        raise DagDefinitionError(
            f"{where}: {kind} {function.__qualname__!r}: nested functions are not supported; "
            "define the function at the module's top level"
        )
    for name, param in inspect.signature(function).parameters.items():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            raise DagDefinitionError(
                f"{where}: {kind} {function.__name__!r}: *{name} is not supported"
            )
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            raise DagDefinitionError(
                f"{where}: {kind} {function.__name__!r}: **{name} is not supported"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and param.default is param.empty:
            raise DagDefinitionError(
                f"{where}: {kind} {function.__name__!r}: the positional-only parameter "
                f"{name!r} needs a default"
            )
    checked: Callable[..., Any] = function
    return checked


def _inlets(function: Callable[..., Any]) -> dict[str, Asset]:
    """The upstream assets the function's parameters name: the module's asset object of that
    name if there is one, else ``Asset(name)``."""
    found: dict[str, Asset] = {}
    module_names = getattr(function, "__globals__", {})
    for name, param in inspect.signature(function).parameters.items():
        if name in RESERVED or param.default is not param.empty:
            continue
        known = module_names.get(name)
        found[name] = known if isinstance(known, Asset) and known.name == name else Asset(name)
    return found


class AssetMainOperator(PythonOperator):
    """The one task of an ``@asset`` DAG: calls the function with what its parameters name."""

    def __init__(self, *, definition: Asset | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.definition = definition

    @property
    def asset_inlets(self) -> dict[str, Asset]:
        """The upstream assets the parameters name, looked up when read: an ``@asset``
        defined further down the module is found once the module is imported."""
        return _inlets(self.python_callable)

    @property  # type: ignore[override]  # read-only here: the parameters say the inlets
    def inlets(self) -> list[Asset]:
        return list(self.asset_inlets.values())

    @inlets.setter
    def inlets(self, value: list[Any]) -> None:
        if value:
            raise DagDefinitionError(
                f"task {self.task_id!r}: an @asset function's inlets are its parameters"
            )

    def execute(self, context: Context) -> Any:
        self.op_kwargs = {**self.op_kwargs, **self._arguments(context)}
        return super().execute(context)

    def _arguments(self, context: Context) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, param in inspect.signature(self.python_callable).parameters.items():
            if param.default is not param.empty:
                values[name] = param.default
            elif name == SELF:
                values[name] = self.definition
            elif name == "context":
                values[name] = context
            elif name == "outlet_events":
                values[name] = context.get("outlet_events")
            else:
                values[name] = self.asset_inlets[name]
        return values


class _DagOptions:
    """The DAG arguments ``@asset`` and ``@asset.multi`` take."""

    def __init__(self, kind: str, schedule: object, dag_options: Mapping[str, Any]) -> None:
        self.where = caller_location()
        unknown = sorted(set(dag_options) - _DAG_ARGUMENTS)
        if unknown:
            raise DagDefinitionError(
                f"{self.where}: {kind} got unknown arguments {unknown}; it takes schedule, "
                f"name, uri, group, extra, watchers and {sorted(_DAG_ARGUMENTS)}"
            )
        self.kind = kind
        self.schedule = schedule
        self.dag_options = dict(dag_options)

    def build(
        self,
        default_dag_id: str,
        function: Callable[..., Any],
        outlets: Sequence[Asset],
        definition: Asset | None,
    ) -> DAG:
        options = dict(self.dag_options)
        dag_id = options.pop("dag_id", None) or default_dag_id
        with DAG(dag_id, schedule=self.schedule, catchup=False, **options) as dag:
            AssetMainOperator(
                task_id=function.__name__,
                python_callable=function,
                outlets=list(outlets),
                definition=definition,
            )
        return dag


class AssetDefinition(Asset):
    """An asset made by an ``@asset`` function: an ``Asset``, with the DAG that updates it."""

    def __init__(self, function: Callable[..., Any], source: asset) -> None:
        name = source.name or function.__name__
        super().__init__(
            name,
            name if source.uri is None else str(source.uri),
            group=source.group,
            extra=source.extra,
            watchers=source.watchers,
        )
        self.function = function
        self.dag = source.options.build(name, function, [self], self)


class MultiAssetDefinition(AssetAll):
    """The assets an ``@asset.multi`` function makes: the condition "all of them updated"."""

    def __init__(self, function: Callable[..., Any], source: asset.multi) -> None:
        super().__init__(*source.outlets)
        self.function = function
        self.outlets = list(source.outlets)
        self.dag = source.options.build(function.__name__, function, self.outlets, None)


class asset:
    """``@asset(schedule=..., name=..., uri=..., group=..., extra=..., watchers=...)``."""

    def __init__(
        self,
        *,
        schedule: object,
        name: str | None = None,
        uri: str | None = None,
        group: str = DEFAULT_ASSET_GROUP,
        extra: dict[str, Any] | None = None,
        watchers: Sequence[AssetWatcher] = (),
        **dag_options: Any,
    ) -> None:
        self.options = _DagOptions("@asset", schedule, dag_options)
        self.name = name
        self.uri = uri
        self.group = group
        self.extra = extra
        self.watchers = watchers

    def __call__(self, function: Callable[..., Any]) -> AssetDefinition:
        checked = _check_function(function, self.options.where, "@asset")
        return AssetDefinition(checked, self)

    class multi:
        """``@asset.multi(schedule=..., outlets=[...])``: one task that updates every outlet."""

        def __init__(
            self, *, schedule: object, outlets: Collection[BaseAsset], **dag_options: Any
        ) -> None:
            self.options = _DagOptions("@asset.multi", schedule, dag_options)
            items: list[Any] = (
                list(outlets) if isinstance(outlets, list | tuple | set) else [outlets]
            )
            if not items or not all(isinstance(item, Asset) for item in items):
                raise DagDefinitionError(
                    f"{self.options.where}: @asset.multi needs outlets=[Asset(...), ...], "
                    f"got {outlets!r}"
                )
            self.outlets: list[Asset] = items

        def __call__(self, function: Callable[..., Any]) -> MultiAssetDefinition:
            checked = _check_function(function, self.options.where, "@asset.multi")
            if SELF in inspect.signature(checked).parameters:
                raise DagDefinitionError(
                    f"{self.options.where}: @asset.multi {checked.__name__!r}: 'self' names one "
                    "asset; a multi-asset function reads its outlets from outlet_events"
                )
            return MultiAssetDefinition(checked, self)
