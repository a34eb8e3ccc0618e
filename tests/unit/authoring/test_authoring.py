"""The authoring API: assets and watchers, DAGs as context managers, >>, @task, deferral."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine import (
    DAG,
    Asset,
    AssetWatcher,
    BaseOperator,
    DagDefinitionError,
    PythonOperator,
    TaskDeferred,
    task,
)
from engine.authoring.dag import take_registered_dags
from engine.authoring.deferral import FAIL_METHOD
from engine.authoring.errors import TaskDeferralError, TaskDeferralTimeout
from engine.authoring.sensors import DateTimeSensor
from engine.db.queries import deferrals
from triggers import (
    DateTimeTrigger,
    FileDeleteTrigger,
    FileTrigger,
    SerializationError,
    StartTriggerArgs,
    TimeDeltaTrigger,
)
from triggers.base import BaseTrigger

THIS_FILE = __file__


class Noop(BaseOperator):
    def execute(self, context: dict[str, Any]) -> str:
        return "done"

    def resume(self, context: dict[str, Any], event: Any = None, **kwargs: Any) -> Any:
        return ("resumed", event, kwargs)


class OpaqueTrigger(BaseTrigger):
    """A trigger whose kwargs cannot be stored."""

    def __init__(self, handle: object) -> None:
        super().__init__()
        self.handle = handle

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("tests.unit.test_authoring.OpaqueTrigger", {"handle": self.handle})

    async def run(self):  # pragma: no cover - never run
        yield


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


# --- assets and watchers -------------------------------------------------------------------


def test_watcher_with_a_plain_base_trigger_names_file_asset_and_watcher() -> None:
    with pytest.raises(DagDefinitionError) as info:
        Asset("orders", watchers=[AssetWatcher("orders_flag", FileTrigger("/tmp/x"))])
    message = str(info.value)
    assert THIS_FILE in message
    assert "'orders'" in message
    assert "'orders_flag'" in message
    assert "triggers.file.FileTrigger" in message
    assert "BaseEventTrigger" in message


def test_watcher_given_a_trigger_class_or_junk_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="not an instance"):
        Asset("a", watchers=[AssetWatcher("w", FileDeleteTrigger)])  # type: ignore[arg-type]
    with pytest.raises(DagDefinitionError, match="BaseEventTrigger instance"):
        Asset("a", watchers=[AssetWatcher("w", "kafka://topic")])  # type: ignore[arg-type]
    with pytest.raises(DagDefinitionError, match="list of AssetWatcher"):
        Asset("a", watchers=AssetWatcher("w", FileDeleteTrigger("/tmp/f")))  # type: ignore[arg-type]


def test_asset_with_event_watchers() -> None:
    watcher = AssetWatcher("flag", FileDeleteTrigger("/tmp/flag"))
    asset = Asset("orders", watchers=[watcher])
    assert asset.uri == "orders"
    assert asset.watchers == (watcher,)
    assert asset == Asset("orders") and hash(asset) == hash(Asset("orders"))
    assert asset != Asset("orders", uri="s3://orders")


def test_duplicate_watcher_names_and_bad_names_are_refused() -> None:
    trigger = FileDeleteTrigger("/tmp/flag")
    with pytest.raises(DagDefinitionError, match="two watchers named 'w'"):
        Asset("a", watchers=[AssetWatcher("w", trigger), AssetWatcher("w", trigger)])
    with pytest.raises(DagDefinitionError, match="Asset name"):
        Asset("")
    with pytest.raises(DagDefinitionError, match="extra"):
        Asset("a", extra={"bad": object()})


# --- DAGs, tasks and dependencies -----------------------------------------------------------


def test_dag_context_manager_collects_tasks_and_registers() -> None:
    with DAG("etl", description="demo") as dag:
        first = Noop(task_id="first")
        with DAG("inner", auto_register=False) as inner:
            other = Noop(task_id="other")
        second = Noop(task_id="second")
    outside = Noop(task_id="outside")
    assert dag.task_ids == ["first", "second"]
    assert inner.task_ids == ["other"]
    assert first.dag is dag and other.dag is inner and outside.dag is None
    assert dag.lineno is not None and dag.fileloc == THIS_FILE
    assert take_registered_dags() == [dag]
    assert second.dag is dag


def test_dag_block_that_raises_is_not_registered() -> None:
    with pytest.raises(RuntimeError), DAG("broken"):
        raise RuntimeError("boom")
    assert take_registered_dags() == []


def test_rshift_lshift_and_lists() -> None:
    with DAG("deps") as dag:
        a, b, c, d = (Noop(task_id=name) for name in "abcd")
        result = a >> [b, c]
        [b, c] >> d
        d << Noop(task_id="e")
    assert result == [b, c]
    assert a.downstream_task_ids == {"b", "c"}
    assert d.upstream_task_ids == {"b", "c", "e"}
    assert dag.topological_task_ids() == ["a", "e", "b", "c", "d"]


def test_dependency_errors() -> None:
    with DAG("one") as one:
        a = Noop(task_id="a")
    with DAG("two"):
        b = Noop(task_id="b")
    with pytest.raises(DagDefinitionError, match="belongs to DAG 'two'"):
        a >> b
    with pytest.raises(DagDefinitionError, match="itself"):
        a >> a
    with pytest.raises(DagDefinitionError, match="link tasks"):
        a >> "b"  # type: ignore[operator]
    loose, orphan = Noop(task_id="loose"), Noop(task_id="orphan")
    with pytest.raises(DagDefinitionError, match="neither belongs to a DAG"):
        loose >> orphan
    loose >> a  # an unattached task joins the DAG of the other one
    assert loose.dag is one


def test_cycles_and_duplicate_task_ids_are_refused() -> None:
    with DAG("cyclic") as dag:
        a, b, c = Noop(task_id="a"), Noop(task_id="b"), Noop(task_id="c")
        a >> b >> c >> a
    with pytest.raises(DagDefinitionError, match="cycle: a >> b >> c >> a"):
        dag.check_cycles()
    with pytest.raises(DagDefinitionError, match="already has a task 'x'"), DAG("dup"):
        Noop(task_id="x")
        Noop(task_id="x")


@pytest.mark.parametrize("bad", ["has space", "", "x" * 251, "slash/es"])
def test_invalid_ids(bad: str) -> None:
    with pytest.raises(DagDefinitionError):
        DAG(bad, auto_register=False)
    with pytest.raises(DagDefinitionError):
        Noop(task_id=bad)


def test_operator_arguments_are_checked() -> None:
    with pytest.raises(DagDefinitionError, match="execution_timeout"):
        Noop(task_id="t", execution_timeout=5)  # type: ignore[arg-type]
    with pytest.raises(DagDefinitionError, match="retries"):
        Noop(task_id="t", retries=-1)
    assert Noop(task_id="t", execution_timeout=timedelta(seconds=3)).execution_timeout


# --- @task ------------------------------------------------------------------------------------


def test_task_decorator_builds_python_operators() -> None:
    @task
    def extract(x: int, triggering_asset_events: dict[str, Any]) -> Any:
        return (x, triggering_asset_events)

    @task(task_id="load_it", retries=2)
    def load(**kwargs: Any) -> Any:
        return kwargs

    with DAG("decorated") as dag:
        first = extract(1)
        again = extract(2)
        last = load(extra="yes")
        [first, again] >> last
    assert dag.task_ids == ["extract", "extract__1", "load_it"]
    assert isinstance(first, PythonOperator) and last.retries == 2
    context = {"dag_id": "decorated", "triggering_asset_events": {"orders": [{"payload": 1}]}}
    assert first.execute(context) == (1, {"orders": [{"payload": 1}]})
    assert last.execute(context) == {**context, "extra": "yes"}


def test_task_decorator_misuse() -> None:
    @task
    def step() -> None:
        return None

    with pytest.raises(DagDefinitionError, match="inside a `with DAG"):
        step()
    with DAG("misuse"):
        upstream = step()
        consumer = task(lambda value: value).override(task_id="consumer")(upstream)
    assert consumer.upstream_task_ids == {"step"}  # a task passed to a call is its result


# --- deferral -----------------------------------------------------------------------------------


def test_defer_raises_task_deferred_with_serialized_trigger() -> None:
    op = Noop(task_id="waiter")
    trigger = TimeDeltaTrigger(timedelta(minutes=5))
    with pytest.raises(TaskDeferred) as info:
        op.defer(trigger=trigger, method_name="resume", kwargs={"n": 1}, timeout=timedelta(1))
    deferred = info.value
    assert not isinstance(deferred, Exception)  # `except Exception` in a task cannot eat it
    assert deferred.trigger is trigger
    assert deferred.classpath == "triggers.temporal.DateTimeTrigger"
    assert deferred.trigger_kwargs == {"moment": trigger.moment, "end_from_trigger": False}
    assert (deferred.method_name, deferred.kwargs) == ("resume", {"n": 1})
    assert deferred.timeout == timedelta(days=1)
    assert "moment" in repr(deferred) and str(trigger.moment) not in repr(deferred)


def test_task_deferred_survives_pickling_without_its_trigger() -> None:
    op = Noop(task_id="waiter")
    with pytest.raises(TaskDeferred) as info:
        op.defer(TimeDeltaTrigger(timedelta(seconds=5)), "resume", {"n": 1}, timedelta(minutes=1))
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.trigger is None
    assert (copy.classpath, copy.trigger_kwargs) == (
        info.value.classpath,
        info.value.trigger_kwargs,
    )
    assert (copy.method_name, copy.kwargs, copy.timeout) == (
        "resume",
        {"n": 1},
        timedelta(minutes=1),
    )


def test_defer_with_unserializable_trigger_kwarg_names_class_and_kwarg() -> None:
    op = Noop(task_id="waiter")
    with pytest.raises(SerializationError) as info:
        op.defer(trigger=OpaqueTrigger(object()), method_name="resume")
    message = str(info.value)
    assert "'waiter'" in message
    assert "tests.unit.test_authoring.OpaqueTrigger" in message
    assert "'handle'" in message


@pytest.mark.parametrize(
    ("kwargs", "method", "timeout", "error", "match"),
    [
        ({"lock": object()}, "resume", None, SerializationError, "kwargs given to defer"),
        ({"event": 1}, "resume", None, SerializationError, "must not contain 'event'"),
        (None, "missing", None, TypeError, "does not name a method"),
        (None, "resume", 30, Exception, "timedelta"),
    ],
)
def test_defer_argument_errors(kwargs, method, timeout, error, match) -> None:
    op = Noop(task_id="waiter")
    trigger = TimeDeltaTrigger(timedelta(seconds=1))
    with pytest.raises(error, match=match):
        op.defer(trigger=trigger, method_name=method, kwargs=kwargs, timeout=timeout)


def test_resume_execution_calls_the_method_or_fails() -> None:
    op = Noop(task_id="waiter")
    assert op.resume_execution("resume", {"event": {"x": 1}, "n": 2}, {}) == (
        "resumed",
        {"x": 1},
        {"n": 2},
    )
    with pytest.raises(TaskDeferralTimeout):
        op.resume_execution(FAIL_METHOD, {"error": "trigger timeout"}, {})
    with pytest.raises(TaskDeferralError, match="its trigger failed: boom\nTraceback"):
        op.resume_execution(FAIL_METHOD, {"error": "boom", "traceback": "Traceback"}, {})
    with pytest.raises(TaskDeferralError, match="no method 'gone'"):
        op.resume_execution("gone", {}, {})


def test_fail_method_matches_the_store() -> None:
    assert FAIL_METHOD == deferrals.FAIL_METHOD


def test_start_from_trigger() -> None:
    class StartsOnTriggerer(Noop):
        start_from_trigger = True
        start_trigger_args = StartTriggerArgs(
            trigger_cls="triggers.temporal.DateTimeTrigger",
            trigger_kwargs={"moment": datetime(2030, 1, 1, tzinfo=UTC)},
            next_method="resume",
            timeout=timedelta(hours=1),
        )

    deferred = StartsOnTriggerer(task_id="s").deferral_at_start()
    assert deferred is not None and deferred.trigger is None
    assert deferred.classpath == "triggers.temporal.DateTimeTrigger"
    assert (deferred.method_name, deferred.timeout) == ("resume", timedelta(hours=1))
    assert Noop(task_id="plain").deferral_at_start() is None

    class Misconfigured(Noop):
        start_from_trigger = True

    with pytest.raises(DagDefinitionError, match="start_trigger_args"):
        Misconfigured(task_id="m").deferral_at_start()


def test_date_time_sensor_can_start_from_trigger() -> None:
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    sensor = DateTimeSensor(task_id="s", target_time=moment, start_from_trigger=True)
    deferred = sensor.deferral_at_start()
    assert deferred is not None
    assert deferred.classpath == "triggers.temporal.DateTimeTrigger"
    assert DateTimeTrigger(**deferred.trigger_kwargs).moment == moment


def test_an_async_python_callable_runs_to_completion_in_execute() -> None:
    ran: list[str] = []

    async def work(dag_id: str) -> str:
        ran.append(dag_id)
        return dag_id.upper()

    op = PythonOperator(task_id="a", python_callable=work)
    assert op.execute({"dag_id": "d"}) == "D"
    assert ran == ["d"]


def test_an_async_generator_callable_is_refused_not_reported_as_a_result() -> None:
    async def stream() -> Any:
        yield 1

    op = PythonOperator(task_id="g", python_callable=stream)
    with pytest.raises(TypeError, match=r"task 'g'.*async generator.*was not run"):
        op.execute({})


async def test_an_async_callable_inside_a_running_loop_fails_clearly() -> None:
    async def work() -> int:
        return 1

    op = PythonOperator(task_id="l", python_callable=work)
    with pytest.raises(RuntimeError, match=r"task 'l'.*was not run"):
        op.execute({})
