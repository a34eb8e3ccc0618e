"""``BaseOperator``, the base of every task, and ``MappedOperator``, the task that
``BaseOperator.partial(...).expand(...)`` adds: one task, run as one copy per item.

Arguments are Airflow's (``engine.authoring.arguments``); the DAG's and task groups'
``default_args`` fill what a caller left out (``engine.authoring.default_args``). A task's
result, for another task's arguments, is ``op.output`` (``op["key"]`` for one of its
``multiple_outputs``; ``op.map(fn)`` / ``op.zip(other)`` to transform it for a mapped task:
``engine.authoring.xcom``). How a task waits on a trigger and resumes is
``engine.authoring.deferral``; what it sees when it runs, ``engine.authoring.context``.

A mapped task keeps the partial arguments and what it maps over; the scheduler counts its
copies (``engine.authoring.mapping``) and each copy runs the operator ``unmap`` builds for
its ``map_index``. ``partial`` itself checks and holds the arguments
(``engine.authoring.partial``), given the class that builds the mapped task.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.arguments import (
    OPERATOR_IGNORED,
    OPERATOR_REJECTED_WHEN_SET,
    OPERATOR_REMOVED,
    TriggerRule,
    as_delay,
    check_id,
    check_timedelta,
    check_trigger_rule,
    check_type,
    split_unsupported,
    warn_once,
)
from engine.authoring.assets import Asset, AssetAlias, as_asset_list
from engine.authoring.callbacks import (
    DEFAULT_POOL,
    TASK_CALLBACKS,
    as_callbacks,
    check_pool,
    check_pool_slots,
)
from engine.authoring.dag import DAG, DEFAULT_OWNER, current_dag
from engine.authoring.default_args import (
    DEFAULT_ARGS_MARK,
    _group_for,
    accepted_arguments,
    applies_default_args,
)
from engine.authoring.deferral import Deferrable
from engine.authoring.dependencies import AbstractOperator
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.mapping import (
    EXPAND,
    EXPAND_KWARGS,
    pick,
    sequence_of,
    source_json,
    unravel,
)
from engine.authoring.params import NOTSET, Param, as_params
from engine.authoring.partial import OperatorPartial
from engine.authoring.retry_policies import RetryPolicy, check_retry_policy
from engine.authoring.setup_teardown import SetupTeardownMixin
from engine.authoring.xcom import (
    MapXComArg,
    XComArg,
    ZipXComArg,
    iter_references,
    resolve_references,
)
from triggers.base import classpath_of

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.authoring.callbacks import Callback
    from engine.authoring.context import Context, RendersTemplates
    from engine.authoring.dag import TaskContainer

#: Airflow's default ``retry_delay``: a failed try with tries left waits this long.
DEFAULT_RETRY_DELAY: Final = timedelta(seconds=300)


class BaseOperator(SetupTeardownMixin, AbstractOperator, Deferrable):
    """Base of every task. Subclasses implement ``execute(context)``.

    Arguments are Airflow's: ``retries``, ``execution_timeout``, ``outlets`` / ``inlets``
    (assets and aliases), ``owner``, ``doc_md``, ``task_display_name``, ``params``,
    ``trigger_rule`` (every Airflow rule), ``default_args``; others are ignored with
    a warning or refused (``engine.authoring.arguments``). Each subclass's ``__init__`` is
    wrapped so that the DAG's (and task group's) ``default_args`` fill what its caller left
    out.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, DEFAULT_ARGS_MARK, False):
            cls.__init__ = applies_default_args(init)  # type: ignore[method-assign]

    @applies_default_args
    def __init__(
        self,
        *,
        task_id: str,
        dag: DAG | None = None,
        task_group: TaskContainer | None = None,
        retries: int = 0,
        retry_delay: timedelta | float = DEFAULT_RETRY_DELAY,
        retry_exponential_backoff: bool = False,
        max_retry_delay: timedelta | float | None = None,
        retry_policy: RetryPolicy | None = None,
        execution_timeout: timedelta | None = None,
        multiple_outputs: bool = False,
        do_xcom_push: bool = True,
        outlets: Asset | AssetAlias | Sequence[Asset | AssetAlias] | None = None,
        inlets: Asset | AssetAlias | Sequence[Asset | AssetAlias] | None = None,
        owner: str = DEFAULT_OWNER,
        doc_md: str | None = None,
        task_display_name: str | None = None,
        map_index_template: str | None = None,
        trigger_rule: TriggerRule | str = TriggerRule.ALL_SUCCESS,
        params: Mapping[str, Any] | None = None,
        pool: str = DEFAULT_POOL,
        pool_slots: int = 1,
        queue: str | None = None,
        on_execute_callback: Callback | Sequence[Callback] | None = None,
        on_success_callback: Callback | Sequence[Callback] | None = None,
        on_failure_callback: Callback | Sequence[Callback] | None = None,
        on_retry_callback: Callback | Sequence[Callback] | None = None,
        on_skipped_callback: Callback | Sequence[Callback] | None = None,
        pre_execute: Callable[[Context], object] | None = None,
        post_execute: Callable[[Context, Any], object] | None = None,
        default_args: Mapping[str, Any] | None = None,  # applied by the __init__ wrapper
        **unsupported: Any,
    ) -> None:
        location = caller_location()
        label = check_id("task_id", task_id, where=location)
        where = f"{location}: task {task_id!r}"
        self._warn_unsupported(unsupported, location, where)
        if dag is not None and not isinstance(dag, DAG):
            raise DagDefinitionError(f"{where}: dag must be a DAG, got {dag!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise DagDefinitionError(f"{where}: retries must be an int >= 0")
        self.retries = retries
        self.retry_delay = as_delay(where, "retry_delay", retry_delay) or timedelta(0)
        check_type(where, "retry_exponential_backoff", retry_exponential_backoff, bool)
        self.retry_exponential_backoff = retry_exponential_backoff
        self.max_retry_delay = as_delay(where, "max_retry_delay", max_retry_delay)
        #: decides from a failed try's exception (``engine.authoring.retry_policies``)
        self.retry_policy = check_retry_policy(where, retry_policy)
        self.execution_timeout = check_timedelta(where, "execution_timeout", execution_timeout)
        for name, flag in (("multiple_outputs", multiple_outputs), ("do_xcom_push", do_xcom_push)):
            check_type(where, name, flag, bool)
        #: a dict result is also stored key by key; ``do_xcom_push=False`` stores no result
        self.multiple_outputs = multiple_outputs
        self.do_xcom_push = do_xcom_push
        self.outlets = as_asset_list(where, "outlets", outlets)
        self.inlets = as_asset_list(where, "inlets", inlets)
        check_type(where, "owner", owner, str)
        self.owner = owner
        if doc_md is not None:
            check_type(where, "doc_md", doc_md, str)
        self.doc_md = doc_md
        if map_index_template is not None:
            check_type(where, "map_index_template", map_index_template, str)
        #: a copy of a mapped task is shown by this template, rendered with its context
        #: once it ran (``engine.execution.map_index``)
        self.map_index_template = map_index_template
        self._trigger_rule = check_trigger_rule(trigger_rule, where=where)
        self.params: dict[str, Param] = as_params(params, where=where)
        #: the executors start the task only while ``pool`` has ``pool_slots`` open
        self.pool = check_pool(where, pool)
        self.pool_slots = check_pool_slots(where, pool_slots)
        if queue is not None and (not isinstance(queue, str) or not queue.strip()):
            raise DagDefinitionError(f"{where}: queue must be a non-empty string, got {queue!r}")
        #: the Celery queue its tries are sent to (None: ``[celery] default_queue``); the
        #: local executor runs every task alike
        self.queue = queue
        given = (
            on_execute_callback,
            on_success_callback,
            on_failure_callback,
            on_retry_callback,
            on_skipped_callback,
        )
        for name, value in zip(TASK_CALLBACKS, given, strict=True):
            setattr(self, name, as_callbacks(where, name, value))
        for name, hook in (("pre_execute", pre_execute), ("post_execute", post_execute)):
            if hook is not None and not callable(hook):
                raise DagDefinitionError(f"{where}: {name} must be a callable, got {hook!r}")
        #: called with the context right before ``execute`` (and before a resume)
        self._pre_execute_hook = pre_execute
        #: called with the context and ``execute``'s result right after it returned
        self._post_execute_hook = post_execute
        self.task_group = _group_for(dag, task_group)
        self.label = label
        full_id = label if self.task_group is None else self.task_group.child_id(label)
        self.task_id = check_id("task_id", full_id, where=location)
        self._display_name = task_display_name
        self.upstream_task_ids: set[str] = set()
        self.downstream_task_ids: set[str] = set()
        self.dag: DAG | None = None
        target = dag or (self.task_group.dag if self.task_group is not None else current_dag())
        if target is not None:
            self._attach(target)
        if self.task_group is not None:
            self.task_group.add(self)

    @classmethod
    def partial(cls, **kwargs: Any) -> OperatorPartial[MappedOperator]:
        """The arguments every copy of a mapped task shares; ``.expand(...)`` or
        ``.expand_kwargs(...)`` on the result adds the task (``engine.authoring.mapping``)."""
        return OperatorPartial(cls, kwargs, mapped=MappedOperator)

    def _warn_unsupported(self, unsupported: Mapping[str, Any], location: str, where: str) -> None:
        kind = type(self).__name__
        names = split_unsupported(
            unsupported,
            owner=kind,
            where=where,
            ignored=OPERATOR_IGNORED,
            rejected=OPERATOR_REJECTED_WHEN_SET,
            removed=OPERATOR_REMOVED,
            known=accepted_arguments(type(self)) - OPERATOR_IGNORED,
        )
        for name in names:
            warn_once(
                "operator",
                name,
                "%s: %s argument %r is not supported yet and is ignored",
                where,
                kind,
                name,
                location=location,
            )

    @property
    def trigger_rule(self) -> TriggerRule:
        return self._trigger_rule

    @trigger_rule.setter
    def trigger_rule(self, value: TriggerRule | str) -> None:
        """Set after construction (``op.trigger_rule = ...``): checked like the argument (an
        unknown rule is refused), and the DAG processor stores it like one."""
        self._trigger_rule = check_trigger_rule(
            value, where=f"{caller_location()}: task {self.task_id!r}"
        )

    def __repr__(self) -> str:
        return f"<Task({type(self).__name__}): {self.task_id}>"

    @property
    def task_display_name(self) -> str:
        return self._display_name or self.task_id

    @property
    def operator_classpath(self) -> str:
        return classpath_of(self)

    def _attach(self, dag: DAG) -> None:
        if self.dag is not None and self.dag is not dag:
            raise DagDefinitionError(
                f"task {self.task_id!r} belongs to DAG {self.dag.dag_id!r}, not {dag.dag_id!r}"
            )
        dag.add_task(self)
        self.dag = dag

    # --- its result ---------------------------------------------------------------------------

    @property
    def output(self) -> XComArg:
        """This task's return value, for another task's arguments (``op.output``); a mapped
        task's is the list of its copies' results, by ``map_index``."""
        return XComArg(self)

    def __getitem__(self, key: str) -> XComArg:
        """This task's result ``key`` (``extract()["total"]``, with ``multiple_outputs``)."""
        return XComArg(self)[key]

    def map(self, function: Callable[[Any], Any]) -> MapXComArg:
        """This task's list or dict result, ``function`` applied to each item (``.expand``)."""
        return self.output.map(function)

    def zip(self, *others: XComArg | AbstractOperator, fillvalue: Any = NOTSET) -> ZipXComArg:
        """This task's result side by side with ``others``' (tuples, for ``.expand``)."""
        return self.output.zip(*others, fillvalue=fillvalue)

    # --- running --------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Do the work; the return value is the task's result."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute(context)")

    def pre_execute(self, context: Context) -> None:
        """Called right before ``execute`` (or the method a deferred task resumes at), after
        the ``pre_execute=`` argument's callable; a subclass may override it. Raising
        ``AirflowSkipException`` here skips the task, any other error fails it."""

    def post_execute(self, context: Context, result: Any = None) -> None:
        """Called right after ``execute`` returned ``result``, after the ``post_execute=``
        argument's callable; a subclass may override it. Not called when ``execute`` raised
        or deferred."""

    def render_template(self, content: Any, context: Context, jinja_env: None = None) -> Any:
        """``content`` rendered with ``context`` as this task's templated fields are (strings
        inside lists, tuples, sets and dict values too; a str ending with one of
        ``template_ext`` is a template file next to the DAG file), Airflow's
        ``render_template``: for code running in the task, e.g.
        ``context["task"].render_template("{{ run_id }}", context)``. Sluice renders with its
        own Jinja environment: a ``jinja_env`` is refused."""
        if jinja_env is not None:
            raise TypeError(
                f"task {self.task_id!r}: render_template() renders with the DAG's Jinja "
                "environment; jinja_env= is not supported"
            )
        ti: RendersTemplates | None = context.get("ti") if isinstance(context, Mapping) else None
        if ti is None or not hasattr(ti, "render_template"):
            raise RuntimeError(
                f"task {self.task_id!r}: render_template() needs the context of a running "
                "task (get_current_context() inside the task)"
            )
        template_ext = tuple(getattr(self, "template_ext", ()))
        return ti.render_template(content, context, template_ext=template_ext)

    def run_pre_execute(self, context: Context) -> None:
        """The ``pre_execute=`` callable, then ``pre_execute`` (what the task runner calls)."""
        if self._pre_execute_hook is not None:
            self._pre_execute_hook(context)
        self.pre_execute(context)

    def run_post_execute(self, context: Context, result: Any) -> None:
        """The ``post_execute=`` callable, then ``post_execute``, with ``execute``'s result."""
        if self._post_execute_hook is not None:
            self._post_execute_hook(context, result)
        self.post_execute(context, result)


_BASE_ARGUMENTS: Final = frozenset(inspect.signature(BaseOperator.__init__).parameters) - {
    "self",
    "unsupported",
}


class MappedOperator(BaseOperator):
    """A task that runs as N copies, one per item of what it maps over (``map_index``).

    Built by ``partial(...).expand(...)``; the scheduler-facing arguments (``retries``,
    ``trigger_rule``, ``outlets`` ...) are the partial ones, shared by every copy.
    ``operator_class`` is the class each copy is; ``expand_into`` is ``"op_kwargs"`` for a
    ``@task`` (its function's arguments are mapped), None for a classic operator.
    """

    #: Arguments of ``BaseOperator`` itself: the scheduler reads them before a copy runs, so
    #: they are the same for every copy (set them in ``partial``).
    BASE_ARGUMENTS: ClassVar[frozenset[str]] = _BASE_ARGUMENTS

    def __init__(
        self,
        *,
        operator_class: type[BaseOperator],
        partial_kwargs: Mapping[str, Any],
        expand_kind: str,
        expand_value: Any,
        expand_into: str | None = None,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(**base_kwargs)  # partial() applied the default_args already
        self.operator_class = operator_class
        self.partial_kwargs = dict(partial_kwargs)
        self.expand_kind = expand_kind
        self.expand_value = expand_value
        self.expand_into = expand_into
        for reference in iter_references((self.partial_kwargs, expand_value)):
            self.set_upstream(reference)

    def __repr__(self) -> str:
        return f"<Mapped({self.operator_class.__name__}): {self.task_id}>"

    @classmethod
    def build(
        cls,
        operator_class: type[AbstractOperator],
        kwargs: Mapping[str, Any],
        kind: str,
        value: Any,
        expand_into: str | None,
    ) -> MappedOperator:
        """The mapped task ``partial(**kwargs).expand(...)`` adds: ``kind`` is ``expand`` or
        ``expand_kwargs``, ``value`` what it maps over."""
        if not issubclass(operator_class, BaseOperator):
            raise TypeError(f"{operator_class!r} is not an operator class (a BaseOperator)")
        if getattr(operator_class, "start_from_trigger", False):
            raise DagDefinitionError(
                f"{caller_location()}: task {kwargs.get('task_id')!r}: "
                f"{operator_class.__name__} starts from a trigger; mapping such operators is "
                "not supported yet"
            )
        base = {k: v for k, v in kwargs.items() if k in cls.BASE_ARGUMENTS}
        rest = {k: v for k, v in kwargs.items() if k not in {"task_id", "dag", "task_group"}}
        return cls(
            operator_class=operator_class,
            partial_kwargs=rest,
            expand_kind=kind,
            expand_value=value,
            expand_into=expand_into,
            **base,
        )

    @property
    def operator_classpath(self) -> str:
        cls = self.operator_class
        return f"{cls.__module__}.{cls.__qualname__}"

    def iter_mapped_sources(self) -> list[XComArg]:
        """The upstream results this task maps over (not those inside literal lists)."""
        if isinstance(self.expand_value, XComArg):
            return self.expand_value.sources()
        if self.expand_kind == EXPAND:
            args = [v for v in self.expand_value.values() if isinstance(v, XComArg)]
            return [source for arg in args for source in arg.sources()]
        return []

    def mapping_json(self) -> dict[str, Any]:
        """What the scheduler needs to count the copies (``dag_task.mapping``)."""
        if self.expand_kind == EXPAND_KWARGS:
            return {"kind": EXPAND_KWARGS, "source": source_json(self.expand_value)}
        args = [{"name": name, **source_json(v)} for name, v in self.expand_value.items()]
        return {"kind": EXPAND, "args": args}

    # --- run time -----------------------------------------------------------------------------

    def mapped_kwargs(self, context: Mapping[str, Any], map_index: int) -> dict[str, Any]:
        """This copy's expanded arguments, references resolved."""
        if self.expand_kind == EXPAND_KWARGS:
            items = sequence_of(self.expand_value, context, self.task_id)
            item = resolve_references(pick(items, map_index, self.task_id), context)
            if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
                raise TypeError(
                    f"mapped task {self.task_id!r}: expand_kwargs() items must be dicts of "
                    f"keyword arguments, item {map_index} is {type(item).__name__}"
                )
            return dict(item)
        values = {n: sequence_of(v, context, self.task_id) for n, v in self.expand_value.items()}
        indexes = unravel(map_index, [len(v) for v in values.values()], self.task_id)
        return {
            name: resolve_references(seq[i], context)
            for (name, seq), i in zip(values.items(), indexes, strict=True)
        }

    def unmap(self, context: Mapping[str, Any]) -> BaseOperator:
        """The operator of the copy ``context["map_index"]`` runs."""
        map_index = int(context.get("map_index", -1))
        if map_index < 0:
            raise RuntimeError(f"mapped task {self.task_id!r} runs only as a copy (map_index)")
        mapped = self.mapped_kwargs(context, map_index)
        kwargs = resolve_references(dict(self.partial_kwargs), context)
        if self.expand_into is not None:
            kwargs[self.expand_into] = {**kwargs.get(self.expand_into, {}), **mapped}
        else:
            kwargs.update(mapped)
        operator = self.operator_class(task_id=self.task_id, **kwargs)
        operator.dag = self.dag
        operator.task_group = self.task_group
        operator.upstream_task_ids = set(self.upstream_task_ids)
        operator.downstream_task_ids = set(self.downstream_task_ids)
        return operator

    def execute(self, context: Context) -> Any:
        return self.unmap(context).execute(context)
