"""The shape of ``engine.views.why.explain_dag``'s answer (stable: keys are only ever
added), what ``sluice dags why --json`` prints and ``GET /api/v1/dags/{dag_id}/why``
returns. Times are ISO 8601 strings in UTC, None (``null``) when unknown.
"""

from __future__ import annotations

from typing import Literal, TypedDict

Severity = Literal["blocker", "waiting", "note"]


class Finding(TypedDict):
    code: str  # see engine.views.why_findings
    severity: Severity
    message: str


class ParseError(TypedDict):
    error: str
    line: int | None
    at: str | None


class DagState(TypedDict):
    fileloc: str
    active: bool
    paused: bool
    last_parsed: str | None
    parse_error: ParseError | None  # of its file


class Run(TypedDict):
    run_id: str
    run_type: str
    state: str
    queued_at: str | None
    start_date: str | None
    end_date: str | None
    logical_date: str | None
    run_after: str | None
    partition_key: str | None


class Runs(TypedDict):
    max_active_runs: int  # the effective limit (the timetable's may be lower)
    active: list[Run]  # the running, then the next queued ones: 20 at most
    running: int
    queued: int
    limit_reached: bool
    last: Run | None


class LeafNode(TypedDict):
    """An asset or an alias of the asset condition, judged by its own ``evaluate``."""

    type: Literal["asset", "alias"]
    name: str
    satisfied: bool
    queued_events: int


class GroupNode(TypedDict):
    """An ``all`` / ``any`` of the asset condition, judged by its own ``evaluate``."""

    type: Literal["all", "any"]
    satisfied: bool
    objects: list[Node]


Node = LeafNode | GroupNode


class AssetSchedule(TypedDict):
    condition: Node | None
    met: bool
    missing: str | None  # what is still missing: "b", "b or c", ...
    last_asset_run: Run | None
    error: str | None


class NextRun(TypedDict):
    logical_date: str | None
    data_interval: list[str | None] | None
    run_after: str | None
    due: bool


class TimeSchedule(TypedDict):
    summary: str | None
    description: str | None
    error: str | None
    next_run: NextRun | None
    source: Literal["scheduler", "computed"]  # stored by the scheduler, or computed now
    held: bool  # due but held by max_active_runs
    last_scheduled_run: Run | None


class RollupWait(TypedDict):
    """An asset under a rollup mapper, for one downstream key: its window's upstream keys."""

    asset: str
    grain: str  # what one upstream key is: "hourly" (a DayWindow's hours), "daily", ...
    expected: int
    arrived: int
    missing_keys: list[str]
    wait_policy: str  # "WaitForAll()", "MinimumCount(20)"
    needed: int | None  # MinimumCount's n


class PartitionWaitEntry(TypedDict):
    """A partition key not ready yet, and what it waits for."""

    partition_key: str
    missing_assets: list[str]  # assets of the condition with no event mapped to the key
    rollups: list[RollupWait]  # rollup assets still missing upstream keys
    events: int  # queued events mapped to the key (they stay queued)
    message: str  # "2026-03-10: waiting for 3 of 24 hourly keys of asset a: ..."


class RefusedPartitionEvent(TypedDict):
    event_id: int
    reason: str  # the scheduler drops it for this DAG at its next loop, and logs this


class PartitionSchedule(TypedDict):
    """A DAG on a ``PartitionedAssetTimetable``: the scheduler's plan for its queued
    events."""

    mappers: dict[str, str]  # asset -> its partition mapper
    queued_events: int
    ready: list[str]  # keys whose condition is met: runs at the scheduler's next loop
    waiting: list[PartitionWaitEntry]  # newest key first, the first 50
    waiting_total: int
    refused: list[RefusedPartitionEvent]


class Schedule(TypedDict):
    kind: Literal["none", "assets", "time", "assets_or_time"]
    text: str  # as `dags list`: "assets a & (b | alias c)", "0 * * * *", "None"
    assets: AssetSchedule | None
    time: TimeSchedule | None
    partitions: PartitionSchedule | None  # a DAG that runs per partition key


class Queued(TypedDict):
    """Events queued for this DAG since its last asset-triggered run."""

    count: int
    last_event_at: str | None
    sources: dict[str, int]  # source -> count


class Owner(TypedDict):
    id: int
    hostname: str | None
    pid: int | None
    state: str
    alive: bool
    heartbeat_age_s: float


class Snapshot(TypedDict):
    """The group lag, as its owner published it."""

    triggerer_id: int
    key: str
    broker: str  # what the group reads: "kafka", "sqs", ... or the trigger class's name
    mode: str
    subscribers: int
    outstanding_events: int
    outstanding_by_lane: dict[str, int]
    oldest_unresolved_age_s: float | None
    advances: int
    overflows: int
    ack_timeouts: int
    dead_lettered: int  # events advanced with a rejected outcome (the dead-letter way)
    snapshot_age_s: float | None


class SharedStream(TypedDict):
    digest: str
    triggers: int
    holders: list[int]
    split: bool
    snapshot: Snapshot | None


WatcherStatus = Literal["ok", "unclaimed", "owner_dead", "load_failed", "failing"]


class Unreachable(TypedDict):
    """The upstream a watcher's last failure could not reach."""

    broker: str  # its kind: "kafka", "rabbitmq", ... or the trigger class's name
    broker_name: str  # as written in a sentence: "Kafka", "RabbitMQ", ...
    address: str | None  # where, as its error named it (None: it named none)


class Watcher(TypedDict):
    name: str
    trigger_id: int
    classpath: str  # never the kwargs
    claimed: bool
    triggerer_id: int | None
    owner: Owner | None
    last_event_at: str | None
    failures: int
    last_error: str | None
    last_failure_at: str | None
    load_failed: bool
    unreachable: Unreachable | None  # its last failure: a broker it could not reach
    shared_stream: SharedStream | None
    status: WatcherStatus
    problem: str | None


class Producer(TypedDict):
    dag_id: str
    task_id: str
    dag_paused: bool
    outlets: list[str]
    outlet_aliases: list[str]
    last_state: str | None
    last_run_id: str | None
    last_end: str | None


class AssetEntry(TypedDict):
    name: str
    uri: str | None
    known: bool
    satisfied: bool
    queued: Queued
    last_event_at: str | None
    last_event_source: str | None
    watchers: list[Watcher]
    producers: list[Producer]
    cause: str | None
    cause_is_problem: bool


class AliasEntry(TypedDict):
    name: str
    satisfied: bool
    queued: Queued
    assets: list[str]
    producers: list[Producer]
    cause: str | None
    cause_is_problem: bool


class EngineState(TypedDict):
    schedulers_alive: int
    triggerers_alive: int
    triggerer_capacity: int | None
    triggers_held: int


class WhyAnswer(TypedDict):
    dag_id: str
    now: str | None
    verdict: str  # one line: the most decisive finding
    findings: list[Finding]  # most decisive first
    dag: DagState
    runs: Runs
    schedule: Schedule
    assets: list[AssetEntry]
    aliases: list[AliasEntry]
    engine: EngineState
