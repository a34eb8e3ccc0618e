"""Bad-input catalogue, runtime half: misbehaving triggers, producers and surroundings.

Every case feeds one kind of bad runtime input to a *running* engine (``sluice run`` as a
subprocess, ``--log-format json``) and checks three things:

(a) a clear error naming the culprit (trigger id, classpath, watcher, producer or file path)
    in the engine's log or in a failed row;
(b) the rest of the engine is unaffected: a healthy control watcher in the same engine still
    turns a fresh event into a DAG run while the bad input is active;
(c) nothing is lost: every event fired is stored (or, for a rejected one, rejected loudly),
    and broker messages are redelivered, never dropped.

Most cases share one engine (SQLite): each misbehaving watcher waits for its *go file*, so a
case starts when its test says so and the cases do not interfere. The plugin triggers live in
``tests/e2e/bad_plugins/runtime_triggers.py`` (copied to the engine's plugins folder). A
broker down at start (Kafka, tansu, behind a TCP proxy that opens once the broker is up) and
the database going away (PostgreSQL behind a TCP proxy the test cuts) each get their own
engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import socket
import subprocess
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from engine.db.database import Database
from engine.db.models import (
    Asset,
    AssetEvent,
    AssetWatcher,
    DagRun,
    DagRunAssetEvent,
    TaskInstance,
    Trigger,
)
from tests.cli import invoke
from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import (
    engine_env,
    log_records,
    log_tail,
    start_engine,
    stop,
    wait_for,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator

pytestmark = pytest.mark.e2e

T = TypeVar("T")

PLUGIN = Path(__file__).parent / "bad_plugins" / "runtime_triggers.py"
TASK_LOG_FS_SIZE = "2m"
CLEANUP_TIMEOUT_S = 2
HUGE_PAYLOAD_BYTES = 20 * 1024 * 1024  # runtime_triggers.HUGE_PAYLOAD_BYTES
PAYLOAD_LIMIT_BYTES = 1_048_576  # the default [core] max_asset_event_payload_bytes
DB_OUTAGE_S = 10.0
MAX_WARNINGS_PER_LOOP = 15  # per loop over the outage: a backoff or a heartbeat, not 20/s

GO_CASES = {  # watcher (and asset) name -> plugin class; each waits for <case>.go
    "exits_without_event": "ExitsWithoutEvent",
    "yields_non_event": "YieldsNonEvent",
    "returns_event": "ReturnsEvent",
    "blocks_loop": "BlocksLoop",
    "raises_in_run": "RaisesInRun",
    "non_serializable_payload": "NonSerializablePayload",
    "huge_payload": "HugePayload",
    "dedup_collision": "DuplicateDedupKeys",
}
BROKER_CASES = {  # broker directory -> {watcher name: poison message}
    "filter_raises": {"filter_bad": "m-002.msg", "filter_good": None},
    "advance_raises": {"advance_watcher": None},
    "open_stream_raises": {"open_watcher": None},
    "open_stream_returns": {"returns_watcher": None},
}
DEFERRED_CASES = {  # DAG id -> (plugin trigger class, defer timeout in seconds)
    "deferred_never_yields": ("NeverYields", 2),
    "deferred_raises_in_cleanup": ("RaisesInCleanup", None),
    "deferred_cleanup_hangs": ("CleanupHangs", None),
    "deferred_trigger_raises": ("DeferredRaises", None),
}

DAGS = """
from datetime import timedelta

from engine import DAG, Asset, AssetAll, AssetWatcher, BaseOperator, task

import runtime_triggers as rt

CASES = {cases!r}
BROKERS = {brokers!r}
MARKERS = {markers!r}

control = Asset("control", watchers=[AssetWatcher("control", rt.ControlWatcher(
    directory=CASES, case="control"))])

BAD = [
    Asset(case, watchers=[AssetWatcher(case, getattr(rt, cls)(directory=CASES, case=case))])
    for case, cls in {go_cases!r}.items()
]
for broker, watchers in {broker_cases!r}.items():
    for name, poison in watchers.items():
        BAD.append(Asset(name, watchers=[AssetWatcher(name, rt.DirBrokerTrigger(
            directory=f"{{BROKERS}}/{{broker}}", name=name, poison=poison))]))


@task
def seen(triggering_asset_events):
    return sorted(e["payload"]["control"] for e in triggering_asset_events["control"])


with DAG("on_control", schedule=control):
    seen()

# Watchers run only for assets a DAG schedule references; "never_fires" has no watcher, so
# the bad watchers' events are stored without ever making a run (no task processes).
with DAG("sink", schedule=AssetAll(*BAD, Asset("never_fires"))):
    seen()


class DeferTo(BaseOperator):
    def __init__(self, *, trigger, timeout_s=None, **kwargs):
        super().__init__(**kwargs)
        self.trigger = trigger
        self.timeout_s = timeout_s

    def execute(self, context):
        trigger = getattr(rt, self.trigger)(marker=f"{{MARKERS}}/{{context['dag_id']}}")
        timeout = None if self.timeout_s is None else timedelta(seconds=self.timeout_s)
        self.defer(trigger=trigger, method_name="resume", timeout=timeout)

    def resume(self, context, event=None):
        return {{"event": event}}


for dag_id, (cls, timeout_s) in {deferred_cases!r}.items():
    with DAG(dag_id, schedule=None):
        DeferTo(task_id="wait", trigger=cls, timeout_s=timeout_s)


with DAG("chatty", schedule=None):
    @task
    def talk():
        for n in range(2000):
            print(f"line {{n}} of a task whose log folder is full " + "." * 60)
        return "talked"
    talk()
"""


# -- reading the engine's JSON log ------------------------------------------------------------


def find_record(log: Path, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    return next((r for r in log_records(log) if match(r)), None)


def wait_record(
    log: Path, what: str, match: Callable[[dict[str, Any]], bool], timeout: float = 30
) -> dict[str, Any]:
    record = wait_for(lambda: find_record(log, match), timeout=timeout, what=what, step=0.2)
    assert isinstance(record, dict)
    return record


def action_for(action: str, trigger_id: int) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r.get("action") == action and r.get("trigger_id") == trigger_id


# -- the shared engine ------------------------------------------------------------------------


class Engine:
    """A running ``sluice run`` and the handles its cases need."""

    def __init__(self, root: Path, env: dict[str, str], db: Database, log: Path) -> None:
        self.root, self.env, self.db, self.log = root, env, db, log
        self.cases = root / "cases"
        self.brokers = root / "brokers"
        self.markers = root / "markers"
        self.task_logs = root / "task-logs"
        self.proc: subprocess.Popen[bytes] | None = None
        self._controls = itertools.count(1)

    # -- inputs --

    def go(self, case: str) -> None:
        (self.cases / f"{case}.go").touch()

    def broker(self, name: str) -> Path:
        return self.brokers / name

    def publish(self, broker: str, *names: str) -> None:
        for name in names:
            tmp = self.broker(broker) / f".{name}"
            tmp.write_text(name)
            tmp.rename(self.broker(broker) / "msgs" / name)

    # -- observations --

    def alive(self) -> None:
        assert self.proc is not None
        assert self.proc.poll() is None, f"the engine exited:\n{self.tail()}"

    def tail(self, chars: int = 4000) -> str:
        return log_tail(self.log, chars)

    def trigger_id(self, watcher: str) -> int:
        found = self.db.call(
            lambda s: s.execute(
                select(AssetWatcher.trigger_id).where(AssetWatcher.name == watcher)
            ).scalar_one()
        )
        return int(found)

    def trigger_row(self, trigger_id: int) -> Trigger | None:
        return self.db.call(lambda s: s.get(Trigger, trigger_id))

    def failure_count(self, trigger_id: int) -> int:
        """Failures the triggerer recorded for the trigger (logged or not)."""
        row = self.trigger_row(trigger_id)
        return 0 if row is None else int(row.failure_count or 0)

    def payloads(self, asset: str) -> list[Any]:
        return self.db.call(
            lambda s: (
                s.execute(
                    select(AssetEvent.payload)
                    .join(Asset, Asset.id == AssetEvent.asset_id)
                    .where(Asset.name == asset)
                    .order_by(AssetEvent.id)
                )
                .scalars()
                .all()
            )
        )

    def dedup_keys(self, asset: str) -> list[str]:
        return self.db.call(
            lambda s: (
                s.execute(
                    select(AssetEvent.dedup_key)
                    .join(Asset, Asset.id == AssetEvent.asset_id)
                    .where(Asset.name == asset)
                    .order_by(AssetEvent.id)
                )
                .scalars()
                .all()
            )
        )

    def control_makes_a_run(self, timeout: float = 30) -> None:
        """(b): a fresh control event is stored and creates a DAG run of ``on_control``."""
        self.alive()
        name = f"c{next(self._controls):03d}.ctl"
        (self.cases / name).touch()

        def linked() -> bool:
            return bool(
                self.db.call(
                    lambda s: s.execute(
                        select(func.count())
                        .select_from(DagRunAssetEvent)
                        .join(AssetEvent, AssetEvent.id == DagRunAssetEvent.asset_event_id)
                        .join(DagRun, DagRun.id == DagRunAssetEvent.dag_run_id)
                        .where(DagRun.dag_id == "on_control", AssetEvent.dedup_key == f"ctl:{name}")
                    ).scalar_one()
                )
            )

        wait_for(linked, timeout=timeout, step=0.1, what=f"control event {name} to make a run")
        self.alive()

    def trigger_dag(self, dag_id: str) -> None:
        done = invoke("dags", "trigger", dag_id, env=self.env)
        assert done.returncode == 0, done.stderr

    def task_instance(self, dag_id: str, task_id: str = "wait") -> TaskInstance | None:
        return self.db.call(
            lambda s: (
                s.execute(
                    select(TaskInstance)
                    .where(TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id)
                    .order_by(TaskInstance.id.desc())
                )
                .scalars()
                .first()
            )
        )

    def wait_task(self, dag_id: str, state: str, task_id: str = "wait", timeout: float = 40) -> Any:
        return wait_for(
            lambda: (t := self.task_instance(dag_id, task_id)) and t.state == state and t,
            timeout=timeout,
            step=0.2,
            what=f"{dag_id}.{task_id} to be {state}",
        )

    def task_log(self, dag_id: str, task_id: str = "wait") -> str:
        run_id = self.db.call(
            lambda s: s.execute(
                select(DagRun.run_id).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc())
            ).scalar()
        )
        done = invoke("tasks", "logs", dag_id, run_id, task_id, env=self.env)
        assert done.returncode == 0, done.stderr
        return done.stdout


def _mount_tmpfs(path: Path) -> bool:
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TASK_LOG_FS_SIZE}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _watcher_names() -> set[str]:
    names = {"control", *GO_CASES}
    for watchers in BROKER_CASES.values():
        names.update(watchers)
    return names


def launch(root: Path, url: str, dags_text: str, **settings: str) -> Engine:
    """Start ``sluice --log-format json run`` on ``root`` with the database at ``url``
    (already migrated: a copy of the session's template), wait for readiness."""
    home, dags, plugins = root / "home", root / "dags", root / "plugins"
    env = engine_env(
        home,
        url=url,
        dags=dags,
        parallelism=4,
        heartbeat_s=1,
        grace_s=5,
        SLUICE__CORE__PLUGINS_FOLDER=str(plugins),
        SLUICE__CORE__FERNET_KEY=Fernet.generate_key().decode(),
        SLUICE__TRIGGERER__TRIGGER_CLEANUP_TIMEOUT_SEC=str(CLEANUP_TIMEOUT_S),
        SLUICE__LOGGING__TASK_LOG_FOLDER=str(root / "task-logs"),
        **settings,
    )
    engine = Engine(root, env, Database(url), root / "engine.log")
    for folder in (home, dags, plugins, engine.cases, engine.markers, engine.task_logs):
        folder.mkdir(exist_ok=True)
    shutil.copy(PLUGIN, plugins / PLUGIN.name)
    (dags / "catalogue.py").write_text(textwrap.dedent(dags_text))
    engine.proc = start_engine(env, engine.log, json_logs=True)
    return engine


def shut(engine: Engine) -> None:
    """SIGTERM; the engine must stop cleanly (exit code 0) whatever the case did to it."""
    assert engine.proc is not None
    code = stop(engine.proc, timeout=60)
    engine.db.dispose()
    assert code == 0, engine.tail()


def watcher_count(engine: Engine) -> int:
    return int(
        engine.db.call(
            lambda s: s.execute(select(func.count()).select_from(AssetWatcher)).scalar_one()
        )
    )


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Engine]:
    root = tmp_path_factory.mktemp("bad-runtime")
    (root / "task-logs").mkdir()
    mounted = _mount_tmpfs(root / "task-logs")
    for broker in BROKER_CASES:
        for sub in ("msgs", "acked", "dead"):
            (root / "brokers" / broker / sub).mkdir(parents=True)
    text = DAGS.format(
        cases=str(root / "cases"),
        brokers=str(root / "brokers"),
        markers=str(root / "markers"),
        go_cases=GO_CASES,
        broker_cases=BROKER_CASES,
        deferred_cases=DEFERRED_CASES,
    )
    engine = None
    try:
        url = copy_sqlite_template(sqlite_template, root / "home" / "sluice.db")
        engine = launch(root, url, text)
        engine.env["TMPFS_MOUNTED"] = str(mounted)
        wait_for(
            lambda: watcher_count(engine) == len(_watcher_names()),
            timeout=60,
            step=0.2,
            what="the DAG file's watchers to be stored",
        )
        engine.control_makes_a_run(timeout=60)  # every part is up and working
        yield engine
    finally:
        try:
            if engine is not None:
                shut(engine)
        finally:
            if mounted:
                subprocess.run(["umount", "-l", str(root / "task-logs")], check=False)


# -- the catalogue: one case function per kind of bad input -----------------------------------

CATALOGUE: dict[str, Callable[[pytest.FixtureRequest], None]] = {}


def case(kind: str) -> Callable[[Callable[[pytest.FixtureRequest], None]], Any]:
    def register(fn: Callable[[pytest.FixtureRequest], None]) -> Any:
        CATALOGUE[kind] = fn
        return fn

    return register


def shared(request: pytest.FixtureRequest) -> Engine:
    engine = request.getfixturevalue("engine")
    assert isinstance(engine, Engine)
    return engine


def failure_recorded(engine: Engine, trigger_id: int, text: str) -> Trigger:
    row = wait_for(
        lambda: (r := engine.trigger_row(trigger_id)) and r.failure_count >= 1 and r,
        timeout=10,
        step=0.1,
        what=f"the failure of trigger {trigger_id} recorded on its row",
    )
    assert isinstance(row, Trigger)
    assert text in (row.last_error or ""), row.last_error
    return row


# -- watcher triggers that misbehave ----------------------------------------------------------


@case("exits_without_event")
def _exits_without_event(request: pytest.FixtureRequest) -> None:
    engine, kind = shared(request), "exits_without_event"
    tid = engine.trigger_id(kind)
    engine.go(kind)
    failed = wait_record(engine.log, "the failure", action_for("trigger_failed", tid))
    assert "watcher trigger exited; event triggers must keep running" in failed["message"]
    assert failed["will_restart"] is True
    engine.control_makes_a_run()
    restart = wait_record(engine.log, "the restart", action_for("trigger_restart", tid))
    assert "runtime_triggers.ExitsWithoutEvent" in restart["message"]
    failure_recorded(engine, tid, "watcher trigger exited")


def watcher_fails(engine: Engine, kind: str, text: str) -> tuple[int, dict[str, Any]]:
    """Start ``kind``; its failure is logged with its trigger id and ``text``, it restarts."""
    tid = engine.trigger_id(kind)
    engine.go(kind)
    failed = wait_record(engine.log, f"{kind} to fail", action_for("trigger_failed", tid))
    assert text in failed["message"], failed["message"]
    assert f"Trigger {tid} (watcher) failed" in failed["message"]
    assert failed["will_restart"] is True
    engine.control_makes_a_run()  # (b) while the watcher waits out its restart backoff
    restart = wait_record(engine.log, f"{kind} to restart", action_for("trigger_restart", tid))
    assert f"runtime_triggers.{GO_CASES[kind]}" in restart["message"]
    failure_recorded(engine, tid, text)
    engine.alive()
    return tid, failed


@case("yields_non_event")
def _yields_non_event(request: pytest.FixtureRequest) -> None:
    engine = shared(request)
    watcher_fails(engine, "yields_non_event", "yielded dict instead of a TriggerEvent")
    assert engine.payloads("yields_non_event") == [{"case": "yields_non_event", "n": 1}]


@case("returns_event")
def _returns_event(request: pytest.FixtureRequest) -> None:
    engine = shared(request)
    watcher_fails(engine, "returns_event", "run() returned a TriggerEvent instead of yielding it")


@case("raises_in_run")
def _raises_in_run(request: pytest.FixtureRequest) -> None:
    engine = shared(request)
    _, failed = watcher_fails(engine, "raises_in_run", "the upstream answered garbage")
    assert "RuntimeError" in failed["message"]
    assert "runtime_triggers.py" in failed["message"]  # the traceback points at the plugin
    # (c) the event it fired before raising is stored
    assert engine.payloads("raises_in_run") == [{"case": "raises_in_run", "n": 1}]


@case("non_serializable_payload")
def _non_serializable_payload(request: pytest.FixtureRequest) -> None:
    engine = shared(request)
    _, failed = watcher_fails(engine, "non_serializable_payload", "cannot serialize")
    assert "connection" in failed["message"] and "object" in failed["message"]
    assert engine.payloads("non_serializable_payload") == [
        {"case": "non_serializable_payload", "n": 1}
    ]


@case("blocks_loop")
def _blocks_loop(request: pytest.FixtureRequest) -> None:
    engine, kind = shared(request), "blocks_loop"
    tid = engine.trigger_id(kind)
    engine.go(kind)
    blocked = wait_record(engine.log, "the watchdog warning", action_for("loop_blocked", tid))
    assert blocked["culprit"] == "runtime_triggers.BlocksLoop"
    assert f"while running trigger {tid} (runtime_triggers.BlocksLoop)" in blocked["message"]
    assert blocked["level"] == "WARNING"
    engine.control_makes_a_run()
    wait_for(
        lambda: engine.payloads(kind) == [{"case": kind, "blocked_s": 1.0}],
        timeout=10,
        what="the blocking trigger's event to be stored",
    )


@case("huge_payload")
def _huge_payload(request: pytest.FixtureRequest) -> None:
    """A 20 MB payload is over ``[core] max_asset_event_payload_bytes`` (1 MiB by default):
    it is rejected with an error naming the trigger, the watcher, the size and the setting,
    recorded on the trigger row; the watcher and its next (small) event carry on."""
    engine, kind = shared(request), "huge_payload"
    tid = engine.trigger_id(kind)
    engine.go(kind)
    rejected = wait_record(
        engine.log, "the rejection", action_for("asset_event_payload_too_large", tid)
    )
    message = rejected["message"]
    assert rejected["level"] == "ERROR"
    assert f"trigger {tid}" in message and f"watcher {kind!r}" in message
    assert "max_asset_event_payload_bytes" in message and f"{PAYLOAD_LIMIT_BYTES:,}" in message
    assert rejected["payload_bytes"] > HUGE_PAYLOAD_BYTES
    wait_for(
        lambda: engine.payloads(kind) == [{"case": kind, "after": True}],
        timeout=20,
        what="the small event after the huge one to be stored",
    )
    failure_recorded(engine, tid, "max_asset_event_payload_bytes")
    engine.control_makes_a_run()


@case("dedup_collision")
def _dedup_collision(request: pytest.FixtureRequest) -> None:
    engine, kind = shared(request), "dedup_collision"
    tid = engine.trigger_id(kind)
    engine.go(kind)
    wait_for(
        lambda: len(engine.payloads(kind)) >= 2,
        timeout=20,
        what="the events with distinct dedup keys to be stored",
    )
    engine.control_makes_a_run()  # the later control event went through the same persister
    assert engine.dedup_keys(kind) == [f"{kind}:same", f"{kind}:other"]
    assert engine.payloads(kind) == [{"case": kind, "n": 0}, {"case": kind, "n": 99}]
    errors = [r for r in log_records(engine.log) if r.get("trigger_id") == tid]
    assert not [r for r in errors if r["level"] in ("ERROR", "WARNING")], errors


# -- shared-stream producers and filters that misbehave ---------------------------------------


def in_folder(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def messages_of(engine: Engine, asset: str) -> list[str]:
    return [p["message"] for p in engine.payloads(asset)]


def wait_messages(engine: Engine, asset: str, expected: list[str], timeout: float = 30) -> None:
    wait_for(
        lambda: sorted(messages_of(engine, asset)) == expected,
        timeout=timeout,
        step=0.1,
        what=f"{asset} to store exactly {expected} (has {messages_of(engine, asset)})",
    )


def wait_broker(engine: Engine, broker: str, acked: set[str], dead: set[str] = frozenset()) -> None:
    base = engine.broker(broker)
    wait_for(
        lambda: in_folder(base / "acked") == acked and in_folder(base / "dead") == dead,
        timeout=30,
        step=0.1,
        what=f"broker {broker}: acked {acked}, dead-lettered {dead}",
    )
    assert in_folder(base / "msgs") == set()


@case("filter_raises")
def _filter_raises(request: pytest.FixtureRequest) -> None:
    """``filter_shared_stream`` of one subscriber raises on a message: that subscriber fails
    and restarts, its sibling on the same stream keeps every message, and the poisoned
    message is dead-lettered by the producer (not dropped)."""
    engine, broker = shared(request), "filter_raises"
    bad = engine.trigger_id("filter_bad")
    engine.publish(broker, "m-001.msg")
    wait_messages(engine, "filter_bad", ["m-001.msg"])
    wait_messages(engine, "filter_good", ["m-001.msg"])
    wait_broker(engine, broker, acked={"m-001.msg"})
    engine.publish(broker, "m-002.msg")
    failed = wait_record(engine.log, "the filter failure", action_for("trigger_failed", bad))
    assert "filter of filter_bad: cannot parse message m-002.msg" in failed["message"]
    assert f"Trigger {bad} (watcher) failed: ValueError" in failed["message"]
    engine.control_makes_a_run()
    wait_record(engine.log, "the restart", action_for("trigger_restart", bad))
    engine.publish(broker, "m-003.msg")
    wait_messages(engine, "filter_good", ["m-001.msg", "m-002.msg", "m-003.msg"])
    wait_messages(engine, "filter_bad", ["m-001.msg", "m-003.msg"])
    wait_broker(engine, broker, acked={"m-001.msg", "m-003.msg"}, dead={"m-002.msg"})


@case("advance_raises")
def _advance_raises(request: pytest.FixtureRequest) -> None:
    """``advance`` raises: the group ends, its watcher fails and restarts, the broker
    redelivers what was not advanced, and deduplication keeps one asset event each."""
    engine, broker = shared(request), "advance_raises"
    tid = engine.trigger_id("advance_watcher")
    (engine.broker(broker) / "advance.fail").touch()
    names = ["a-001.msg", "a-002.msg", "a-003.msg"]
    engine.publish(broker, *names)
    ended = wait_record(
        engine.log,
        "the group to terminate",
        lambda r: (
            r.get("action") == "shared_stream.group_terminated"
            and str(engine.broker(broker)) in r["message"]
        ),
    )
    assert "advance refused" in ended["message"]
    failed = wait_record(engine.log, "the watcher failure", action_for("trigger_failed", tid))
    assert "advance refused" in failed["message"]
    engine.control_makes_a_run()
    wait_record(engine.log, "the restart", action_for("trigger_restart", tid))
    wait_broker(engine, broker, acked=set(names))
    wait_messages(engine, "advance_watcher", names)


@case("open_stream_raises")
def _open_stream_raises(request: pytest.FixtureRequest) -> None:
    """The producer's ``open_stream`` raises mid-stream, then at every open while its broker
    is unreachable: the watcher fails and retries with backoff; once the broker is back,
    the messages published meanwhile are all delivered."""
    engine, broker = shared(request), "open_stream_raises"
    tid = engine.trigger_id("open_watcher")
    base = engine.broker(broker)
    engine.publish(broker, "o-001.msg")
    wait_broker(engine, broker, acked={"o-001.msg"})
    (base / "open.fail").touch()
    engine.publish(broker, "o-002.msg", "o-003.msg")
    unreachable = f"dir broker {base} is unreachable"

    failed_before = engine.failure_count(tid)

    def failures() -> list[dict[str, Any]]:
        return [
            r
            for r in log_records(engine.log)
            if action_for("trigger_failed", tid)(r) and unreachable in r["message"]
        ]

    # An unreachable broker (UpstreamUnavailable) is an expected condition: one warning with
    # its backoff, then retries with a growing backoff at DEBUG, which the log leaves out.
    wait_for(
        lambda: engine.failure_count(tid) >= failed_before + 3,
        timeout=30,
        step=0.2,
        what="three failed opens",
    )
    (warning,) = failures()
    assert (warning["level"], warning["will_restart"], warning["backoff_s"]) == (
        "WARNING",
        True,
        1.0,
    )
    assert "exc_info" not in warning and "Traceback" not in warning["message"]
    engine.control_makes_a_run()  # (b) while the broker is down
    (base / "open.fail").unlink()
    wait_broker(engine, broker, acked={"o-001.msg", "o-002.msg", "o-003.msg"})
    wait_messages(engine, "open_watcher", ["o-001.msg", "o-002.msg", "o-003.msg"])


@case("open_stream_returns")
def _open_stream_returns(request: pytest.FixtureRequest) -> None:
    """``open_stream`` returns: the group ends with a message saying it must keep yielding,
    the watcher restarts, and nothing published around the end is lost or duplicated."""
    engine, broker = shared(request), "open_stream_returns"
    tid = engine.trigger_id("returns_watcher")
    engine.publish(broker, "r-001.msg", "r-002.msg")
    wait_messages(engine, "returns_watcher", ["r-001.msg", "r-002.msg"])
    (engine.broker(broker) / "stream.end").touch()
    failed = wait_record(engine.log, "the watcher failure", action_for("trigger_failed", tid))
    assert "must yield for the group's whole lifetime" in failed["message"]
    assert str(engine.broker(broker)) in failed["message"]
    engine.publish(broker, "r-003.msg")
    engine.control_makes_a_run()
    wait_record(engine.log, "the restart", action_for("trigger_restart", tid))
    names = ["r-001.msg", "r-002.msg", "r-003.msg"]
    wait_broker(engine, broker, acked=set(names))
    wait_messages(engine, "returns_watcher", names)


# -- deferred tasks whose trigger misbehaves --------------------------------------------------


def marker(engine: Engine, dag_id: str) -> Path:
    return engine.markers / dag_id


@case("never_yields")
def _never_yields(request: pytest.FixtureRequest) -> None:
    """A deferred task's trigger that never fires: the deferral timeout fails the task
    ("trigger timeout") and the trigger is stopped and cleaned up, not left running."""
    engine, dag_id = shared(request), "deferred_never_yields"
    engine.trigger_dag(dag_id)
    ti = engine.wait_task(dag_id, "deferred")
    tid = ti.trigger_id
    engine.control_makes_a_run()  # (b) while the trigger hangs
    engine.wait_task(dag_id, "failed")
    assert "trigger timeout" in engine.task_log(dag_id)
    wait_for(
        lambda: marker(engine, dag_id).exists(),
        timeout=15,
        what=f"trigger {tid} to be stopped and cleaned up after its task timed out",
    )
    wait_record(engine.log, "the stop", action_for("trigger_stop", tid))


@case("raises_in_cleanup")
def _raises_in_cleanup(request: pytest.FixtureRequest) -> None:
    """``cleanup()`` raises after the event fired: logged with the trigger id, and the task
    still resumes with the event (the failure neither fails it nor loses the event)."""
    engine, dag_id = shared(request), "deferred_raises_in_cleanup"
    engine.trigger_dag(dag_id)
    ti = engine.wait_task(dag_id, "success")
    assert ti.xcoms["return_value"] == {"event": {"fired": "RaisesInCleanup"}}
    record = wait_record(
        engine.log,
        "the cleanup failure",
        lambda r: (
            r.get("action") == "trigger_cleanup_failed" and "cleanup-boom" in r.get("exc_info", "")
        ),
    )
    assert f"Trigger {record['trigger_id']} failed while running cleanup()" in record["message"]
    engine.control_makes_a_run()


@case("cleanup_hangs")
def _cleanup_hangs(request: pytest.FixtureRequest) -> None:
    engine, dag_id = shared(request), "deferred_cleanup_hangs"
    engine.trigger_dag(dag_id)
    ti = engine.wait_task(dag_id, "success")
    assert ti.xcoms["return_value"] == {"event": {"fired": "CleanupHangs"}}
    record = wait_record(
        engine.log,
        "the cleanup timeout",
        lambda r: r.get("action") == "trigger_cleanup_timeout",
    )
    assert f"Trigger {record['trigger_id']} did not finish running cleanup()" in record["message"]
    assert f"within {CLEANUP_TIMEOUT_S:.2f}s" in record["message"]
    engine.control_makes_a_run()


@case("deferred_trigger_raises")
def _deferred_trigger_raises(request: pytest.FixtureRequest) -> None:
    engine, dag_id = shared(request), "deferred_trigger_raises"
    engine.trigger_dag(dag_id)
    engine.wait_task(dag_id, "failed")
    text = engine.task_log(dag_id)
    assert "deferred-boom: job 42 is unknown to the remote service" in text
    assert "runtime_triggers.py" in text  # the trigger's traceback reaches the task log
    record = wait_record(
        engine.log,
        "the trigger failure",
        lambda r: r.get("action") == "trigger_failed" and "deferred-boom" in r["message"],
    )
    assert f"Trigger {record['trigger_id']} (task) failed: ValueError" in record["message"]
    engine.control_makes_a_run()


# -- the surroundings -------------------------------------------------------------------------


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(chunk)
                handle.flush()
        except OSError:
            pass
    return filler


@case("task_log_disk_full")
def _task_log_disk_full(request: pytest.FixtureRequest) -> None:
    """``[logging] task_log_folder`` is full (a 2 MB tmpfs filled up): the task still runs
    and succeeds, the engine says which log file it cannot write and why, and its output
    goes to the engine's stderr instead."""
    engine = shared(request)
    if engine.env["TMPFS_MOUNTED"] != "True":
        pytest.fail("this case mounts a tmpfs for the task logs: run the tests as root")
    filler = _fill(engine.task_logs)
    try:
        engine.trigger_dag("chatty")
        ti = engine.wait_task("chatty", "success", task_id="talk")
        assert ti.xcoms["return_value"] == "talked"
        record = wait_record(
            engine.log,
            "the unwritable log warning",
            lambda r: r.get("action") == "task_log_unwritable" and "chatty" in r.get("path", ""),
        )
        assert record["path"].startswith(str(engine.task_logs))
        assert "No space left on device" in record["message"]
        assert "line 1999 of a task whose log folder is full" in engine.log.read_text()
        engine.control_makes_a_run()  # its task log cannot be written either
    finally:
        filler.unlink()


# -- a broker down at start, and the database going away: an engine each -------------------

CONTROL_DAGS = """
from engine import DAG, Asset, AssetAll, AssetWatcher, task

import runtime_triggers as rt

control = Asset("control", watchers=[AssetWatcher("control", rt.ControlWatcher(
    directory={cases!r}, case="control"))])


@task
def seen(triggering_asset_events):
    return sorted(e["payload"]["control"] for e in triggering_asset_events["control"])


with DAG("on_control", schedule=control):
    seen()
"""

KAFKA_DAGS = """
from producers import KafkaMessageTrigger

orders = Asset("orders", watchers=[AssetWatcher("orders", KafkaMessageTrigger(
    topics=[{topic!r}], bootstrap_servers={bootstrap!r}, group_id="bad-inputs",
    auto_offset_reset="earliest", session_timeout_ms=1000, heartbeat_interval_ms=100,
    rebalance_timeout_ms=1000))])

with DAG("on_orders", schedule=AssetAll(orders, Asset("never_fires"))):
    seen()
"""


KAFKA_IO_TIMEOUT_S = 20.0  # this test's own producer and offset reads, each bounded


def _bounded(coro: Coroutine[Any, Any, T], timeout_s: float = KAFKA_IO_TIMEOUT_S) -> T:
    """Run ``coro`` to completion in a fresh event loop, failing after ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


class CuttableProxy:
    """A TCP proxy on a port of its own to ``target``.

    Closed until ``start()``: the port is bound but not listening, so a connection is
    refused and no other process can take the port meanwhile. ``cut()`` closes it again and
    resets every open connection; ``close()`` releases the port.
    """

    def __init__(self, target: tuple[str, int] | None = None) -> None:
        self.target = target
        self._listener = self._reserve(0)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._serving = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _reserve(port: int) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return sock

    def start(self, target: tuple[str, int] | None = None) -> None:
        """Listen, and forward each connection to ``target`` (or the one given before)."""
        self.target = target or self.target
        assert self.target is not None, "a proxy needs a target to start"
        listener = self._listener
        listener.listen()
        listener.settimeout(0.1)
        self._serving.set()
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Stop listening (connections are refused) and reset every open connection."""
        if self._thread is not None:
            self._serving.clear()
            self._thread.join(timeout=5)
            assert not self._thread.is_alive(), "the proxy's accept loop did not stop"
            self._thread = None
            self._listener = self._reserve(self.port)  # the old listener closed with its loop
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self, listener: socket.socket) -> None:
        assert self.target is not None
        with listener:
            while self._serving.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                client.settimeout(None)
                upstream.settimeout(None)
                with self._lock:
                    self._sockets.update((client, upstream))
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _create_topic(broker: Any, name: str, partitions: int) -> None:
    command = [str(broker.binary), "topic", "create", "--broker", broker.url]
    done = subprocess.run(
        [*command, "--partitions", str(partitions), name],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert done.returncode == 0, done.stderr or done.stdout


@case("broker_down_at_start")
def _broker_down_at_start(request: pytest.FixtureRequest) -> None:
    """A Kafka watcher whose broker is down when the engine starts: it fails with a message
    naming the broker address, retries with a growing backoff, and once the broker is up it
    consumes every message (each once) and commits them.

    The watcher's bootstrap address is a proxy that refuses connections until the broker
    runs and has its topic; then the proxy opens (the broker advertises its own address, so
    only the bootstrap goes through the proxy)."""
    import aiokafka  # noqa: F401 - fail early if the kafka extra is missing

    from tests import services_kafka

    tmp = request.getfixturevalue("tmp_path")
    topic, partitions = "orders", 2
    proxy = CuttableProxy()
    bootstrap = f"127.0.0.1:{proxy.port}"
    text = CONTROL_DAGS.format(cases=str(tmp / "cases")) + KAFKA_DAGS.format(
        topic=topic, bootstrap=bootstrap
    )
    broker = None
    try:
        url = copy_sqlite_template(
            request.getfixturevalue("sqlite_template"), tmp / "home" / "sluice.db"
        )
        engine = launch(tmp, url, text)
    except BaseException:
        proxy.close()
        raise
    try:
        wait_for(lambda: watcher_count(engine) == 2, timeout=60, what="the watchers")
        tid = engine.trigger_id("orders")

        def failures() -> list[dict[str, Any]]:
            return [r for r in log_records(engine.log) if action_for("trigger_failed", tid)(r)]

        wait_for(
            lambda: engine.failure_count(tid) >= 3, timeout=30, step=0.1, what="three attempts"
        )
        (first,) = failures()  # one warning; the retries after it are DEBUG lines
        assert first["level"] == "WARNING" and first["address"] == bootstrap
        assert "the Kafka broker is unreachable" in first["message"]
        assert f"cannot reach {bootstrap}" in first["message"]
        assert "(the watchers restart with backoff)" in first["message"]
        assert first["backoff_s"] == 1.0
        assert "retrying in 1s, then with a backoff doubling up to 60s" in first["message"]
        engine.control_makes_a_run()  # (b) while the broker is down
        broker = services_kafka.start_tansu(tmp / "tansu.log")
        _create_topic(broker, topic, partitions)
        host, port = broker.bootstrap.rsplit(":", 1)
        proxy.start((host, int(port)))  # the broker is up, with its topic
        count = 40
        records = [(i % partitions, f"k{i}".encode(), b'{"n": %d}' % i, []) for i in range(count)]
        _bounded(services_kafka.produce(broker.bootstrap, topic, records))
        wait_for(
            lambda: len(engine.payloads("orders")) == count,
            timeout=60,
            step=0.2,
            what=f"all {count} messages to be stored once the broker is up",
        )
        want = {f"kafka:{topic}:{p}:{o}" for p in range(partitions) for o in range(count // 2)}
        assert set(engine.dedup_keys("orders")) == want
        assert sorted(p["value"]["n"] for p in engine.payloads("orders")) == list(range(count))
        per_partition = dict.fromkeys(range(partitions), count // partitions)
        wait_for(
            lambda: (
                _bounded(
                    services_kafka.committed_offsets(
                        broker.bootstrap, "bad-inputs", topic, partitions
                    )
                )
                == per_partition
            ),
            timeout=30,
            step=0.5,
            what="every offset to be committed",
        )
        engine.control_makes_a_run()
    finally:
        try:
            shut(engine)
        finally:
            proxy.close()
            if broker is not None:
                services_kafka.stop_tansu(broker.process)


@case("database_outage")
def _database_outage(request: pytest.FixtureRequest) -> None:
    """PostgreSQL goes away for 10 s (the TCP proxy between engine and server refuses and
    resets connections) and comes back: the engine says the database is unavailable, keeps
    running, keeps the events fired meanwhile in its outbox and stores them all after."""
    tmp, pg_url = request.getfixturevalue("tmp_path"), request.getfixturevalue("migrated_pg_url")
    real = make_url(pg_url)
    proxy = CuttableProxy((real.host or "127.0.0.1", real.port or 5432))
    proxy.start()
    url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        engine = launch(tmp, url, CONTROL_DAGS.format(cases=str(tmp / "cases")))
    except BaseException:
        proxy.close()
        raise
    engine.db.dispose()
    engine.db = Database(pg_url)  # the test observes directly, not through the proxy
    try:
        wait_for(lambda: watcher_count(engine) == 1, timeout=60, what="the control watcher")
        engine.control_makes_a_run(timeout=60)
        proxy.cut()
        cut_at = time.monotonic()
        names = [f"outage-{n}.ctl" for n in range(3)]
        for name in names:
            (engine.cases / name).touch()
        # The watcher takes (deletes) them while the database is unreachable: from now on
        # the events exist only in the engine's outbox.
        wait_for(
            lambda: not any((engine.cases / name).exists() for name in names),
            timeout=DB_OUTAGE_S,
            step=0.1,
            what="the control watcher to take the files fired during the outage",
        )
        wait_record(
            engine.log,
            "the persister to say the database is unavailable",
            lambda r: r.get("action") == "persist_retry",
        )
        while time.monotonic() - cut_at < DB_OUTAGE_S:
            engine.alive()
            time.sleep(0.5)
        assert not (set(names) & {n.rsplit(":", 1)[-1] for n in engine.dedup_keys("control")})
        proxy.start()
        wait_for(
            lambda: {f"ctl:{n}" for n in names} <= set(engine.dedup_keys("control")),
            timeout=60,
            step=0.2,
            what="the events fired during the outage to be stored",
        )
        engine.alive()
        engine.control_makes_a_run(timeout=60)
        records = log_records(engine.log)
        retry = next(r for r in records if r.get("action") == "persist_retry")
        assert "Metadata database unavailable" in retry["message"]
        assert not [r for r in records if r["level"] == "CRITICAL"], "no part crashed"
        # Said clearly, not flooded: every retrying loop backs off during the outage. A loop is
        # its logger and action (messages carry changing counts and delays).
        warnings = Counter(
            (r.get("action") or r["message"].split(":")[0], r["logger"], r.get("part"))
            for r in records
            if r["level"] == "WARNING"
        )
        assert max(warnings.values()) <= MAX_WARNINGS_PER_LOOP, warnings
        # Nobody was declared dead for a heartbeat the outage made late: no task re-run or
        # failed for a lost worker.
        actions = {action for action, _, _ in warnings}
        assert not actions & {"tasks_recovered", "task_lost", "task_outcome_discarded"}, warnings
    finally:
        try:
            shut(engine)
        finally:
            proxy.close()


# -- the test -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(CATALOGUE))
def test_bad_runtime(kind: str, request: pytest.FixtureRequest) -> None:
    CATALOGUE[kind](request)
