"""The Celery executor end to end: ``sluice run`` with ``[executor] kind = "celery"`` and
real ``sluice celery worker`` subprocesses, on Redis and on RabbitMQ."""

from __future__ import annotations

import json
import socket
import urllib.request
from typing import TYPE_CHECKING

import pytest

from tests.cli import invoke
from tests.db_reads import find_task_instance
from tests.e2e.celery_world import CeleryWorld, kill, make_world
from tests.e2e.helpers import wait_for
from tests.services_celery import forget_queues
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.services_celery import RestartableBroker

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SMALL_DAG = """
from engine import DAG, Asset, task

done = Asset("celery_done")


@task
def first():
    print("first ran here")
    return {"n": 41}


@task(outlets=[done])
def second(value):
    return value["n"] + 1


with DAG("small", schedule=None):
    second(first())


@task
def seen(triggering_asset_events):
    return [e.source_task_id for e in triggering_asset_events[done]]


with DAG("after_small", schedule=[done]):
    seen()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def world(
    tmp_path: Path, sqlite_template: Path, broker_url: str, queue_prefix: str
) -> Iterator[Callable[..., CeleryWorld]]:
    worlds: list[CeleryWorld] = []

    def make(files: dict[str, str], db_url: str | None = None, **settings: str) -> CeleryWorld:
        built = make_world(
            tmp_path,
            files,
            template=sqlite_template,
            broker_url=broker_url,
            queue_prefix=queue_prefix,
            db_url=db_url,
            **settings,
        )
        worlds.append(built)
        return built

    yield make
    for built in worlds:
        built.close()
    forget_queues(broker_url, queue_prefix)


def test_a_dag_runs_on_a_worker_with_results_outlets_and_logs(
    world: Callable[..., CeleryWorld],
) -> None:
    port = free_port()
    w = world(
        {"small.py": SMALL_DAG}, SLUICE__METRICS__ENABLED="true", SLUICE__METRICS__PORT=str(port)
    )
    w.start_engine(("small", "after_small"))
    _, worker_log = w.start_worker("one")
    run_id = w.trigger("small")
    w.wait_run("small", run_id, timeout=90)
    # the run its outlet's event triggered: a task on the worker read the event, which its
    # process asked the worker's supervisor for (the spec carries none)
    seen = wait_for(
        lambda: (w.results("after_small").get("seen") or {}).get("return_value"),
        timeout=90,
        what="the after_small run's task to store its result",
    )
    assert deserialize_value(seen) == ["second"], w.describe("after_small")

    # the result of `first` reached `second`, whose return value is stored
    result = invoke("tasks", "result", "small", run_id, "second", "--json", env=w.env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"]["return_value"] == 42
    # its outlet's asset event was written with its success
    events = invoke("assets", "events", "celery_done", "--json", env=w.env)
    assert len(json.loads(events.stdout)) == 1, events.stdout
    # the task's log is the try's log file, as under the local executor
    logs = invoke("tasks", "logs", "small", run_id, "first", env=w.env)
    assert "first ran here" in logs.stdout, logs.stdout
    # the tries ran in the worker, none in `sluice run`
    worker_text = worker_log.read_text()
    assert "Task small.first" in worker_text and "Task small.second" in worker_text
    assert "Task small.first" not in w.log.read_text()
    ti = w.db.call(lambda s: find_task_instance(s, "small", run_id, "second"))
    assert ti is not None and ti.try_number == 1
    # `sluice jobs list` shows the worker: an executor job with its queues, its concurrency
    # as capacity and the tries it runs as load
    listed = invoke("jobs", "list", "--json", env=w.env)
    workers = [j for j in json.loads(listed.stdout) if j["queues"]]
    assert [(j["type"], j["queues"], j["capacity"], j["load"]) for j in workers] == [
        ("executor", [w.queue("default")], 2, 0)
    ]
    assert workers[0]["alive"] and workers[0]["hostname"]
    # the metrics endpoint counts the messages sent per queue (small's two, after_small's)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    sent = f'sluice_celery_sent_total{{queue="{w.queue("default")}"}} 3.0'
    assert sent in text, [line for line in text.splitlines() if "celery" in line]


FIFTY_DAG = """
import os

from engine import DAG, task

HEAVY = {heavy!r}


@task
def light(i):
    return os.environ["SLUICE_TEST_WORKER"]


@task
def heavy(i):
    return os.environ["SLUICE_TEST_WORKER"]


with DAG("fifty", schedule=None, max_active_tasks=50):
    for i in range(25):
        light.override(task_id=f"light_{{i}}")(i)
        heavy.override(task_id=f"heavy_{{i}}", queue=HEAVY)(i)
"""


def test_fifty_tasks_over_two_workers_and_two_queues(
    migrated_pg_url: str, world: Callable[..., CeleryWorld], queue_prefix: str
) -> None:
    """On PostgreSQL, as a fleet of hosts would run it (the database is set up first, so it
    is dropped after the engine and workers stopped)."""
    source = FIFTY_DAG.format(heavy=f"{queue_prefix}heavy")
    w = world({"fifty.py": source}, db_url=migrated_pg_url)
    w.start_engine(("fifty",))
    w.start_worker("a", queues=("default",), concurrency=2)
    w.start_worker("b", queues=("default", "heavy"), concurrency=2)
    run_id = w.trigger("fifty")
    w.wait_run("fifty", run_id, timeout=180)

    ran_on = {task: xcoms["return_value"] for task, xcoms in w.results("fifty").items()}
    # the heavy queue has one consumer: every heavy task ran on worker b
    assert {ran_on[f"heavy_{i}"] for i in range(25)} == {"b"}
    # the default queue has two; both took some (b was busy with heavy ones meanwhile)
    assert {ran_on[f"light_{i}"] for i in range(25)} <= {"a", "b"}
    assert "a" in {ran_on[f"light_{i}"] for i in range(25)}
    states = w.task_states("fifty")
    assert len(states) == 50
    assert {state for state, _ in states.values()} == {"success"}
    assert {tries for _, tries in states.values()} == {1}  # each ran once


CRASH_DAG = """
import os
import time
from pathlib import Path

from engine import DAG, task

RUNS = Path({runs!r})


@task(retries=1, retry_delay=0)
def slow():
    with RUNS.open("a") as f:
        f.write(os.environ["SLUICE_TEST_WORKER"] + "\\n")
    if len(RUNS.read_text().splitlines()) == 1:
        time.sleep(600)  # the first run is killed with its worker
    return "done"


with DAG("crash", schedule=None):
    slow()
"""


def test_a_try_whose_worker_is_killed_runs_again_exactly_once(
    world: Callable[..., CeleryWorld], tmp_path: Path, broker_url: str
) -> None:
    runs = tmp_path / "runs.txt"
    w = world({"crash.py": CRASH_DAG.format(runs=str(runs))})
    w.start_engine(("crash",))
    started = {name: w.start_worker(name, concurrency=1) for name in ("a", "b")}
    workers = {name: proc for name, (proc, _) in started.items()}
    run_id = w.trigger("crash")

    first = wait_for(
        lambda: runs.exists() and runs.read_text().split(),
        timeout=60,
        what="the first run of the task",
    )
    victim = first[0]
    kill(workers[victim])  # SIGKILL mid-task: no ack, no job end, no outcome
    w.wait_run("crash", run_id, timeout=90)

    lines = runs.read_text().split()
    survivor = "b" if victim == "a" else "a"
    assert lines == [victim, survivor]  # ran again exactly once, on the other worker
    states = w.task_states("crash")
    assert states["slow"] == ("success", 2)  # the second try, as the task's retries allow
    assert w.results("crash")["slow"]["return_value"] == "done"
    if broker_url.startswith("amqp"):
        # RabbitMQ redelivered the killed worker's unacknowledged message at once; the
        # metadata DB said the try was not waiting any more, so it was dropped, not run
        assert "celery_message_dropped" in started[survivor][1].read_text()


RESTART_DAG = """
import os
import time
from pathlib import Path

from engine import DAG, task

RUNS = Path({runs!r})


@task
def step(i):
    with RUNS.open("a") as f:
        f.write(f"{{i}}\\n")
    time.sleep(0.3)
    return i


with DAG("restart", schedule=None, max_active_tasks=20):
    for i in range(12):
        step.override(task_id=f"step_{{i}}")(i)
"""


def test_a_broker_restart_mid_run_loses_no_try(
    tmp_path: Path,
    sqlite_template: Path,
    restartable_broker: RestartableBroker,
    queue_prefix: str,
) -> None:
    """RabbitMQ keeps its durable queues; the Redis here keeps nothing on disk, so the
    messages it held are gone with it and their tries are sent again after
    ``task_queued_timeout``. Either way every try runs, none twice."""
    runs = tmp_path / "runs.txt"
    w = make_world(
        tmp_path,
        {"restart.py": RESTART_DAG.format(runs=str(runs))},
        template=sqlite_template,
        broker_url=restartable_broker.url,
        queue_prefix=queue_prefix,
        SLUICE__CELERY__TASK_QUEUED_TIMEOUT="3",
    )
    try:
        w.start_engine(("restart",))
        w.start_worker("a", concurrency=1)
        run_id = w.trigger("restart")
        wait_for(
            lambda: runs.exists() and len(runs.read_text().split()) >= 2,
            timeout=60,
            what="a first try to run",
        )
        restartable_broker.restart()  # the worker's and the sender's connections drop
        w.wait_run("restart", run_id, timeout=120)
        done = sorted(int(i) for i in runs.read_text().split())
        assert done == list(range(12))  # every try ran, none twice
        assert {n for _, n in w.task_states("restart").values()} == {1}
        if restartable_broker.name == "redis":
            assert "celery_tries_resent" in w.log.read_text()
    finally:
        w.close()


DEFER_DAG = """
import os

from engine import DAG, BaseOperator, task
from triggers import FileTrigger

SLOW = {slow!r}
RELEASE = {release!r}


class WaitForRelease(BaseOperator):
    def execute(self, context):
        self.defer(trigger=FileTrigger(RELEASE, poke_interval=0.1), method_name="resume",
                   kwargs={{"first": os.environ["SLUICE_TEST_WORKER"]}})

    def resume(self, context, event=None, first=None):
        return {{"first": first, "resumed": os.environ["SLUICE_TEST_WORKER"]}}


@task(queue=SLOW)
def meanwhile():
    return os.environ["SLUICE_TEST_WORKER"]


with DAG("defer", schedule=None):
    WaitForRelease(task_id="wait", queue=SLOW)
    meanwhile()
"""


def test_a_deferred_task_frees_its_slot_and_resumes_on_a_worker_of_its_queue(
    world: Callable[..., CeleryWorld], tmp_path: Path, queue_prefix: str
) -> None:
    release = tmp_path / "release.flag"
    source = DEFER_DAG.format(slow=f"{queue_prefix}slow", release=str(release))
    w = world({"defer.py": source})
    w.start_engine(("defer",))
    w.start_worker("a", queues=("default",), concurrency=1)
    _, slow_log = w.start_worker("b", queues=("slow",), concurrency=1)
    run_id = w.trigger("defer")

    # the one slot of the slow queue's worker ran `meanwhile` while `wait` was deferred
    def deferred_and_other_done() -> bool:
        states = w.task_states("defer")
        return (
            states.get("wait", ("",))[0] == "deferred"
            and states.get("meanwhile", ("",))[0] == "success"
        )

    wait_for(deferred_and_other_done, timeout=60, what="wait deferred, meanwhile done")
    release.write_text("go")
    w.wait_run("defer", run_id, timeout=60)

    results = w.results("defer")
    assert results["meanwhile"]["return_value"] == "b"
    assert results["wait"]["return_value"] == {"first": "b", "resumed": "b"}
    assert w.task_states("defer")["wait"] == ("success", 1)  # resumed as the same try
    # two Celery tasks for `wait`: its first step, then its resume
    assert slow_log.read_text().count("Task defer.wait") == 2, slow_log.read_text()[-3000:]
