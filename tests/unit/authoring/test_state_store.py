"""The state stores as a task sees them (``engine.authoring.state_store``) and
``ResumableJobMixin``'s flow, over an in-memory store in place of the request channel: what
``set`` sends (retention, ``NEVER_EXPIRE``), the values and keys refused, the context's
``task_state_store`` / ``asset_state_store`` (subscript, single-asset shorthand, absent
without concrete inlets or outlets), and on a retry: reconnect, finished job, resubmit."""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import pytest

from engine import (
    DAG,
    NEVER_EXPIRE,
    Asset,
    AssetAlias,
    BaseOperator,
    PythonOperator,
    ResumableJobMixin,
)
from engine.authoring.dag import take_registered_dags
from engine.authoring.resumable import RESUMABLE_JOB_KEY
from engine.authoring.state_store import TaskStateStore
from engine.authoring.store import StoreUnavailableError, install_store
from engine.execution.context import hydrate_context

ORDERS = Asset("orders")
REPORT = Asset("report")


class MemoryStore:
    """The task process's store, in memory: the state store requests it received."""

    def __init__(self) -> None:
        self.task: dict[str, Any] = {}
        self.assets: dict[str, dict[str, Any]] = {}
        self.retentions: dict[str, tuple[float | None, bool]] = {}

    def task_state_get(self, key):
        return key in self.task, self.task.get(key)

    def task_state_set(self, key, value, *, retention_s, never_expire):
        self.task[key] = value
        self.retentions[key] = (retention_s, never_expire)

    def task_state_delete(self, key):
        self.task.pop(key, None)

    def task_state_clear(self):
        self.task.clear()

    def asset_state_get(self, asset, key):
        values = self.assets.get(asset, {})
        return key in values, values.get(key)

    def asset_state_set(self, asset, key, value):
        self.assets.setdefault(asset, {})[key] = value

    def asset_state_delete(self, asset, key):
        self.assets.get(asset, {}).pop(key, None)

    def asset_state_clear(self, asset):
        self.assets.pop(asset, None)

    def get_connection(self, conn_id):
        return None

    def get_variable(self, key):
        return None

    def set_variable(self, key, value, description):
        raise NotImplementedError

    def delete_variable(self, key):
        return 0

    def mask(self, secrets):
        pass


@pytest.fixture
def store():
    memory = MemoryStore()
    previous = install_store(memory)
    yield memory
    install_store(previous)


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def _context(task: BaseOperator) -> dict[str, Any]:
    raw = {"dag_id": "d", "run_id": "r", "try_number": 1, "run": {"run_id": "r"}}
    return hydrate_context(raw, task)


def _op(task_id: str = "t", **kwargs: Any) -> BaseOperator:
    with DAG("d"):
        return PythonOperator(task_id=task_id, python_callable=lambda: None, **kwargs)


def test_set_get_delete_clear_and_the_retention_sent(store: MemoryStore) -> None:
    tss = _context(_op())["task_state_store"]
    assert tss.get("job", default="none") == "none"
    tss.set("job", "j-1")
    tss.set("short", {"n": 1}, retention=timedelta(hours=6))
    tss.set("forever", [1, 2], retention=NEVER_EXPIRE)
    assert store.retentions == {
        "job": (None, False),  # [state_store] default_retention_days
        "short": (21_600.0, False),
        "forever": (None, True),
    }
    assert tss.get("job") == "j-1"
    tss.delete("job")
    tss.delete("job")  # a key that is not set: nothing happens
    assert tss.get("job") is None
    tss.clear()
    assert store.task == {}


@pytest.mark.parametrize(
    ("value", "retention", "error"),
    [
        (None, None, ValueError),
        ({1, 2}, None, TypeError),
        (float("nan"), None, TypeError),
        ("v", timedelta(0), ValueError),
        ("v", 3600, TypeError),
    ],
)
def test_values_and_retentions_refused(store, value, retention, error) -> None:
    tss = _context(_op())["task_state_store"]
    with pytest.raises(error, match=r"task_state_store.set\('k'\)"):
        tss.set("k", value, retention=retention)
    assert store.task == {}


def test_outside_a_running_task_the_store_says_where_it_works() -> None:
    previous = install_store(None)
    try:
        tss = TaskStateStore(dag_id="d", run_id="r", task_id="t", map_index=-1)
        with pytest.raises(StoreUnavailableError, match=r"task_state_store\.get"):
            tss.get("k")
    finally:
        install_store(previous)


def test_never_expire_is_one_named_value() -> None:
    assert repr(NEVER_EXPIRE) == "NEVER_EXPIRE"
    assert pickle.loads(pickle.dumps(NEVER_EXPIRE)) is NEVER_EXPIRE


def test_asset_state_store_by_subscript_and_single_asset_shorthand(store) -> None:
    one = _context(_op(outlets=[ORDERS]))["asset_state_store"]
    one.set("watermark", "2026-06-01")
    assert one[ORDERS].get("watermark") == one["orders"].get("watermark") == "2026-06-01"
    with pytest.raises(KeyError, match="not one of its concrete asset inlets or outlets"):
        one[REPORT]
    two = _context(_op("two", inlets=[ORDERS], outlets=[REPORT]))["asset_state_store"]
    with pytest.raises(ValueError, match=r"needs exactly one; use asset_state_store\[asset\]"):
        two.get("watermark")
    two[REPORT].set("rows", 3)
    assert store.assets == {"orders": {"watermark": "2026-06-01"}, "report": {"rows": 3}}
    two[ORDERS].clear()
    assert store.assets == {"report": {"rows": 3}}


def test_no_asset_state_store_without_concrete_inlets_or_outlets() -> None:
    assert "asset_state_store" not in _context(_op())
    assert "asset_state_store" not in _context(_op("alias", outlets=[AssetAlias("a")]))
    assert "task_state_store" in _context(_op("plain"))


class Job(ResumableJobMixin, BaseOperator):
    """An external system in memory: job id -> status."""

    def __init__(self, statuses: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.statuses = statuses
        self.calls: list[str] = []

    def execute(self, context):
        return self.execute_resumable(context)

    def submit_job(self, context):
        job = f"job-{len(self.statuses)}"
        self.statuses[job] = "running"
        self.calls.append(f"submit {job}")
        return job

    def get_job_status(self, external_id, context):
        return self.statuses[external_id]

    def is_job_active(self, status):
        return status == "running"

    def is_job_succeeded(self, status):
        return status == "done"

    def poll_until_complete(self, external_id, context):
        self.calls.append(f"poll {external_id}")
        self.statuses[external_id] = "done"

    def get_job_result(self, external_id, context):
        return f"result of {external_id}"


def _job(statuses: dict[str, str]) -> Job:
    with DAG("d"):
        return Job(statuses, task_id="job")


@pytest.mark.parametrize(
    ("stored_status", "calls", "result"),
    [
        (None, ["submit job-0", "poll job-0"], "result of job-0"),
        ("running", ["poll job-0"], "result of job-0"),  # reconnect, no second submit
        ("done", [], "result of job-0"),  # it finished meanwhile: its result
        ("failed", ["submit job-1", "poll job-1"], "result of job-1"),  # a new job
    ],
)
def test_execute_resumable(store, stored_status, calls, result) -> None:
    statuses = {} if stored_status is None else {"job-0": stored_status}
    if stored_status is not None:
        store.task[RESUMABLE_JOB_KEY] = "job-0"  # what the killed try stored
    op = _job(statuses)
    assert op.execute(_context(op)) == result
    assert op.calls == calls
    assert store.task[RESUMABLE_JOB_KEY] == result.removeprefix("result of ")


def test_a_job_without_an_id_is_submitted_again_on_every_try(store) -> None:
    op = _job({})
    op.submit_job = lambda context: None  # type: ignore[method-assign]
    op.poll_until_complete = lambda external_id, context: None  # type: ignore[method-assign]
    op.get_job_result = lambda external_id, context: "done"  # type: ignore[method-assign]
    assert op.execute(_context(op)) == "done"
    assert RESUMABLE_JOB_KEY not in store.task
