"""What parsing one DAG file found, as plain data: the DAGs (ids, schedules, tasks and
edges), the assets (with each watcher's trigger classpath and kwargs), or the error that
stopped the import. The parsing child (``engine.dag_processing.parsing``) prints one
``FileParseResult`` as JSON; the DAG processor reads it back and stores it (``sync``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, is_dataclass, replace
from typing import Any, Final

from engine.authoring.callbacks import DEFAULT_POOL


@dataclass(frozen=True, slots=True)
class ParsedWatcher:
    name: str
    classpath: str
    kwargs: str  # dumps_kwargs text: may hold secrets
    #: digest of the trigger's shared_stream_key() (None: it shares no stream); its rows
    #: are claimed as one group across triggerers (engine.triggerer.claiming)
    stream_digest: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedAsset:
    name: str
    uri: str
    extra: dict[str, Any] = field(default_factory=dict)
    watchers: tuple[ParsedWatcher, ...] = ()


@dataclass(frozen=True, slots=True)
class ParsedTask:
    task_id: str
    operator: str
    downstream: tuple[str, ...] = ()
    retries: int = 0
    start_from_trigger: bool = False
    execution_timeout_s: float | None = None
    #: tagged JSON text of a start_from_trigger task's trigger (may hold secrets; the
    #: parent stores it encrypted in ``dag_task.start_trigger``)
    start_trigger: str | None = None
    outlets: tuple[str, ...] = ()  # asset names updated on success
    outlet_aliases: tuple[str, ...] = ()  # aliases the task may attach events to
    inlets: tuple[str, ...] = ()  # asset names whose events the task reads
    inlet_aliases: tuple[str, ...] = ()  # aliases whose events the task reads
    trigger_rule: str = "all_success"
    retry_delay_s: float = 300.0
    retry_exponential_backoff: bool = False
    max_retry_delay_s: float | None = None
    #: a mapped task's ``mapping_json()`` (engine.authoring.mapping); None when unmapped
    mapping: dict[str, Any] | None = None
    pool: str = DEFAULT_POOL
    pool_slots: int = 1
    queue: str | None = None  # the Celery queue (None: [celery] default_queue)
    is_setup: bool = False
    is_teardown: bool = False
    on_failure_fail_dagrun: bool = False  # a teardown whose failure fails the run
    edge_labels: dict[str, str] | None = None  # downstream task id -> its edge's Label


@dataclass(frozen=True, slots=True)
class ParsedDag:
    dag_id: str
    lineno: int | None = None
    description: str | None = None
    schedule: dict[str, Any] | None = None  # the asset condition
    schedule_assets: tuple[str, ...] = ()
    tasks: tuple[ParsedTask, ...] = ()
    schedule_aliases: tuple[str, ...] = ()
    timetable: dict[str, Any] | None = None  # engine.authoring.timetables serialize()
    timetable_summary: str | None = None
    timezone: str = "UTC"
    start_date: str | None = None  # ISO 8601, UTC
    end_date: str | None = None
    catchup: bool = False
    max_active_runs: int = 16
    max_active_tasks: int = 16
    dagrun_timeout_s: float | None = None
    tags: tuple[str, ...] = ()
    #: name -> ``engine.authoring.params.param_spec`` (JSON: default, schema): a manual
    #: run's conf is checked against it when triggered (``check_run_conf``)
    params: dict[str, Any] | None = None
    doc_md: str | None = None
    display_name: str | None = None
    is_paused_upon_creation: bool | None = None
    has_on_success_callback: bool = False
    has_on_failure_callback: bool = False
    #: the DAG's ``deadline`` alerts, serialized (``engine.authoring.deadlines``)
    deadline_alerts: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ParseError:
    type: str
    message: str
    lineno: int | None = None
    traceback: str | None = None

    def describe(self, fileloc: str) -> str:
        """``file:line: Type: message``, the form users see."""
        where = fileloc if self.lineno is None else f"{fileloc}:{self.lineno}"
        return f"{where}: {self.type}: {self.message}"


@dataclass(frozen=True, slots=True)
class FileParseResult:
    fileloc: str
    dags: tuple[ParsedDag, ...] = ()
    assets: tuple[ParsedAsset, ...] = ()
    error: ParseError | None = None
    #: sha256 of the source that parsed (a change of code alone is a new version)
    source_sha256: str | None = None
    #: the source text that parsed: from the child to the parent only, which stores it
    #: apart (``without_source``); not part of a result's identity
    source: str | None = field(default=None, compare=False, repr=False)
    #: the modules of the dags and plugins folders the file imported (their paths): the
    #: DAG processor parses the file again when one changes; from the child to the parent
    #: only, not stored, not part of a result's identity
    imports: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def without_source(self) -> FileParseResult:
        """This result as stored in ``dag_file.result`` (the source goes to its own column;
        the imports are the parent's to keep)."""
        return replace(self, source=None, imports=())

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        """The text of ``asdict(self)``, written without building that copy first (each
        dataclass is turned into its fields as the encoder meets it)."""
        return json.dumps(self, default=_fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FileParseResult:
        """Rebuild from ``to_json`` text; ``ValueError`` when it is not such a document."""
        try:
            return _result_from_dict(json.loads(text))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"malformed DAG file parse result: {exc!r}") from exc


def _fields(value: object) -> dict[str, Any]:
    """A dataclass instance's fields, for ``json.dumps`` (as ``asdict`` gives them, one level
    at a time); anything else is not JSON."""
    if is_dataclass(value) and not isinstance(value, type):
        return {name: getattr(value, name) for name in value.__dataclass_fields__}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _result_from_dict(data: dict[str, Any]) -> FileParseResult:
    error = data["error"]
    return FileParseResult(
        fileloc=str(data["fileloc"]),
        dags=tuple(_dag_from_dict(item) for item in data["dags"]),
        assets=tuple(_asset_from_dict(item) for item in data["assets"]),
        error=None if error is None else ParseError(**error),
        source_sha256=data.get("source_sha256"),
        source=data.get("source"),
        imports=tuple(str(item) for item in data.get("imports", ())),
    )


_TASK_TUPLES: Final = ("downstream", "outlets", "outlet_aliases", "inlets", "inlet_aliases")
_DAG_TUPLES: Final = ("schedule_assets", "schedule_aliases", "tags", "deadline_alerts")


def _dag_from_dict(data: dict[str, Any]) -> ParsedDag:
    """A stored DAG (documents written before a field existed get its default)."""
    tuples: dict[str, Any] = {key: tuple(data[key]) for key in _DAG_TUPLES if key in data}
    return ParsedDag(
        **{
            **data,
            **tuples,
            "tasks": tuple(
                ParsedTask(**{**task, **{k: tuple(task[k]) for k in _TASK_TUPLES if k in task}})
                for task in data["tasks"]
            ),
        }
    )


def _asset_from_dict(data: dict[str, Any]) -> ParsedAsset:
    watchers = tuple(ParsedWatcher(**item) for item in data["watchers"])
    return ParsedAsset(**{**data, "watchers": watchers})
