"""The port surface: an Airflow 3 DAG file parses after changing only its imports."""

from __future__ import annotations

import logging
import textwrap
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pendulum
import pytest

from engine import (
    DAG,
    BaseOperator,
    CronTriggerTimetable,
    DagDefinitionError,
    EmptyOperator,
    Param,
    PythonOperator,
    TriggerRule,
    task,
)
from engine.authoring.arguments import forget_warnings
from engine.authoring.dag import take_registered_dags
from engine.authoring.dag_files import collect_dags, import_dag_file
from engine.authoring.params import DagParam

THIS_FILE = __file__
DAG_LOGGER = "engine.authoring.arguments"

# The import line of a port, exactly as the issue names it (one line in the file).
PORT_IMPORT = (
    "from engine import dag, task, Asset, AssetAlias, Metadata, chain, TaskGroup, task_group, "
    "Param, TriggerRule\n"
)
PORTED_DAG = (
    '''"""A DAG as Airflow 3 writes it; only the imports changed."""
from datetime import timedelta

import pendulum

'''
    + PORT_IMPORT
    + '''from engine.exceptions import AirflowSkipException, AirflowFailException

orders = Asset("s3://bucket/orders")


@dag(
    start_date=pendulum.datetime(2025, 1, 1, tz="Europe/Berlin"),
    catchup=False,
    tags=["example", "orders"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5), "owner": "x"},
    schedule="@daily",
    params={"limit": Param(10, type="integer", minimum=1)},
)
def example_orders(region: str = "eu"):
    """Loads the day's orders."""

    @task(outlets=[orders])
    def extract(ti, dag_run, params, ds):
        if params["limit"] < 0:
            raise AirflowFailException("negative limit")
        return ds

    @task(trigger_rule=TriggerRule.ALL_SUCCESS)
    def load():
        raise AirflowSkipException("nothing to load")

    with TaskGroup("checks") as checks:
        load.override(task_id="first")() >> load.override(task_id="second")()

    chain(extract(), checks, load())


example_orders()
'''
)


@pytest.fixture(autouse=True)
def _clean_state():
    take_registered_dags()
    forget_warnings()
    yield
    take_registered_dags()
    forget_warnings()


class Noop(BaseOperator):
    def execute(self, context: dict[str, Any]) -> None:
        return None


def _ignored(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "argument_ignored"]


def test_a_ported_airflow_dag_file_parses(tmp_path, caplog) -> None:
    path = tmp_path / "example_orders.py"
    path.write_text(PORTED_DAG)
    with caplog.at_level(logging.WARNING, logger=DAG_LOGGER):
        (parsed,) = collect_dags(import_dag_file(path), str(path))
    assert parsed.dag_id == "example_orders"
    assert parsed.doc_md == "Loads the day's orders."
    assert parsed.tags == ["example", "orders"]
    assert parsed.catchup is False
    assert str(parsed.timezone) == "Europe/Berlin"
    assert parsed.start_date == datetime(2024, 12, 31, 23, tzinfo=UTC)
    assert parsed.timetable is not None and parsed.timetable.summary == "@daily"
    assert parsed.schedule is None
    assert parsed.params["limit"].value == 10 and parsed.params["region"].value == "eu"
    assert parsed.task_ids == ["checks.first", "checks.second", "extract", "load"]
    assert parsed.get_task("checks.first").upstream_task_ids == {"extract"}
    assert parsed.get_task("load").upstream_task_ids == {"checks.second"}
    assert {t.retries for t in parsed.tasks} == {2} and {t.owner for t in parsed.tasks} == {"x"}
    assert {t.retry_delay for t in parsed.tasks} == {timedelta(minutes=5)}  # from default_args
    assert _ignored(caplog) == []


def test_airflow_exceptions_have_their_names() -> None:
    from engine.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
        AirflowTaskTimeout,
        ParamValidationError,
        SluiceError,
    )
    from engine.sensors import SensorTimeout

    for error in (
        AirflowFailException,
        AirflowSkipException,
        AirflowSensorTimeout,
        AirflowTaskTimeout,
        AirflowNotFoundException,
        ParamValidationError,
    ):
        assert issubclass(error, AirflowException)
    assert issubclass(AirflowException, SluiceError)
    assert issubclass(SensorTimeout, AirflowSensorTimeout)


def test_from_engine_import_dag_is_the_decorator() -> None:
    from engine import dag

    @dag
    def bare() -> None:
        Noop(task_id="t")

    @dag("named", schedule=None)
    def other() -> None:
        Noop(task_id="t")

    assert bare().dag_id == "bare" and other().dag_id == "named"


# --- DAG arguments ---------------------------------------------------------------------------


def test_dag_arguments_are_stored() -> None:
    new = DAG(
        "args",
        schedule=timedelta(hours=1),
        start_date=datetime(2025, 3, 1, 8),
        end_date=date(2025, 12, 31),
        catchup=True,
        tags={"b", "a"},
        description="d",
        doc_md="# doc",
        max_active_runs=3,
        dag_display_name="Args",
        is_paused_upon_creation=True,
        auto_register=False,
    )
    assert new.timezone is UTC  # naive start_date: UTC, as in Airflow
    assert new.start_date == datetime(2025, 3, 1, 8, tzinfo=UTC)
    assert new.end_date == datetime(2025, 12, 31, tzinfo=UTC)
    assert (new.catchup, new.tags, new.max_active_runs) == (True, ["a", "b"], 3)
    assert (new.description, new.doc_md, new.dag_display_name) == ("d", "# doc", "Args")
    assert new.is_paused_upon_creation is True
    assert new.max_active_tasks == 16 and new.dagrun_timeout is None
    assert new.schedule_json() is None


def test_dag_defaults_follow_airflow_3() -> None:
    new = DAG("defaults", auto_register=False)
    assert new.catchup is False
    assert (new.timetable, new.schedule, new.start_date, new.end_date) == (None, None, None, None)
    assert new.timezone is UTC
    assert new.tags == [] and new.params == {} and new.default_args == {}
    assert new.max_active_runs == 16 and new.dag_display_name == "defaults"
    assert new.is_paused_upon_creation is None


def test_start_date_from_default_args_and_its_zone() -> None:
    start = pendulum.datetime(2025, 6, 1, tz="America/New_York")
    new = DAG("da", default_args={"start_date": start, "retries": 1}, auto_register=False)
    assert new.start_date == datetime(2025, 6, 1, 4, tzinfo=UTC)
    assert str(new.timezone) == "America/New_York"
    assert "start_date" not in new.default_args  # tasks do not get it


def test_a_timetable_and_a_cron_take_the_dag_zone() -> None:
    start = datetime(2025, 1, 1, tzinfo=pendulum.timezone("Asia/Tokyo"))
    new = DAG("cron", schedule="30 6 * * *", start_date=start, auto_register=False)
    assert isinstance(new.timetable, CronTriggerTimetable)
    given = CronTriggerTimetable("0 1 * * *", timezone="UTC")
    assert DAG("tt", schedule=given, auto_register=False).timetable is given


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"catchup": "yes"}, "catchup must be bool"),
        ({"tags": "one"}, "tags must be a list"),
        ({"tags": ["x" * 101]}, "longer than 100"),
        ({"max_active_runs": 0}, "at least 1"),
        ({"max_active_runs": True}, "max_active_runs must be int"),
        ({"dagrun_timeout": 30}, "dagrun_timeout must be a datetime.timedelta"),
        ({"start_date": "2025-01-01"}, "start_date must be a datetime"),
        ({"default_args": ["retries"]}, "default_args must be a dict"),
        ({"params": {"n": Param(0, type="integer", minimum=1)}}, "the default of param 'n'"),
        ({"start_date": datetime(2025, 2, 1), "end_date": datetime(2025, 1, 1)}, "before"),
        ({"schedule": "not a cron"}, "not a cron"),
    ],
)
def test_bad_dag_arguments_name_the_dag_and_the_argument(kwargs, match) -> None:
    with pytest.raises(DagDefinitionError, match=match) as info:
        DAG("bad", auto_register=False, **kwargs)
    assert THIS_FILE in str(info.value)


def test_a_scheduled_dag_needs_defaults_for_its_params() -> None:
    DAG("manual", params={"n": Param(type="integer")}, auto_register=False)
    with pytest.raises(DagDefinitionError, match=r"params \['n'\] have no default"):
        DAG("daily", schedule="@daily", params={"n": Param(type="integer")}, auto_register=False)


def test_unsupported_dag_arguments_warn_once_each(caplog) -> None:
    def callback(context: object) -> None:
        return None

    with caplog.at_level(logging.WARNING, logger=DAG_LOGGER):
        for dag_id in ("one", "two"):
            DAG(
                dag_id,
                sla_miss_callback=callback,
                owner_links={"ann": "https://example.com"},
                access_control=None,  # asks for nothing: no warning
                auto_register=False,
            )
    records = _ignored(caplog)
    assert [r.argument for r in records] == ["sla_miss_callback", "owner_links"]
    assert records[0].dag_id == "one" and records[0].name == DAG_LOGGER
    assert THIS_FILE in records[0].getMessage() and "'sla_miss_callback'" in records[0].getMessage()


def test_limits_are_stored_without_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=DAG_LOGGER):
        new = DAG(
            "limits", max_active_tasks=4, dagrun_timeout=timedelta(hours=1), auto_register=False
        )
        DAG("defaults", max_active_tasks=16, auto_register=False)
    assert (new.max_active_tasks, new.dagrun_timeout) == (4, timedelta(hours=1))
    messages = [r.getMessage() for r in _ignored(caplog)]
    # both are enforced now: max_active_tasks (engine.executor.admission) and dagrun_timeout
    assert messages == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fail_fast": True}, "fail_fast=True is not supported yet"),
        ({"max_consecutive_failed_dag_runs": 3}, "is not supported yet"),
        ({"schedule_interval": "@daily"}, "removed from Airflow; use schedule="),
        ({"concurrency": 4}, "use max_active_tasks="),
        ({"dag_run_timeout": timedelta(1)}, "unknown argument 'dag_run_timeout'.*'dagrun_timeout'"),
        ({"no_such_thing": 1}, "unknown argument 'no_such_thing'"),
    ],
)
def test_refused_and_unknown_dag_arguments(kwargs, match) -> None:
    with pytest.raises(DagDefinitionError, match=match):
        DAG("refused", auto_register=False, **kwargs)
    DAG("fine", fail_fast=False, max_consecutive_failed_dag_runs=0, auto_register=False)


# --- @dag --------------------------------------------------------------------------------------


def test_dag_decorator_builds_and_registers_with_params() -> None:
    from engine import dag

    seen: dict[str, Any] = {}

    @dag(schedule=None, params={"n": 1}, doc_md="explicit")
    def pipeline(limit: int = 5, *, label: str = "x") -> None:
        """Ignored: doc_md was given."""
        seen.update(limit=limit, label=label)

        @task
        def use(value: int, params: dict[str, Any]) -> tuple[int, int]:
            return value, params["n"]

        use(limit)

    built = pipeline(limit=7)
    assert take_registered_dags() == [built]
    assert built.doc_md == "explicit"
    assert {name: p.value for name, p in built.params.items()} == {"n": 1, "limit": 7, "label": "x"}
    assert isinstance(seen["limit"], DagParam)
    runner = built.get_task("use")
    assert runner.execute({"params": {"limit": 9, "n": 2}}) == (9, 2)  # the run's value


def test_dag_decorator_reports_bad_calls() -> None:
    from engine import dag

    @dag
    def needs_two(a: int = 1) -> None:
        return None

    with pytest.raises(DagDefinitionError, match="needs_two"):
        needs_two(1, 2)


# --- operator arguments ----------------------------------------------------------------------


def test_default_args_fill_only_what_the_operator_accepts_and_the_caller_left_out() -> None:
    class Sized(BaseOperator):
        def __init__(self, *, size: int = 0, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.size = size

    defaults = {"retries": 3, "size": 9, "owner": "team", "not_an_arg": 1}
    with DAG("filled", default_args=defaults, auto_register=False):
        plain = Sized(task_id="plain")
        explicit = Sized(task_id="explicit", retries=0, size=1)
        other = Noop(task_id="other")  # no size parameter: not passed
        own = Noop(task_id="own", default_args={"retries": 5})
    assert (plain.retries, plain.size, plain.owner) == (3, 9, "team")
    assert (explicit.retries, explicit.size) == (0, 1)
    assert (other.retries, other.owner, own.retries) == (3, "team", 5)


def test_operator_arguments_of_airflow(caplog) -> None:
    from engine import Asset, AssetAlias

    orders, alias = Asset("orders"), AssetAlias("daily")
    with caplog.at_level(logging.WARNING, logger=DAG_LOGGER), DAG("ops", auto_register=False):
        op = Noop(
            task_id="op",
            outlets=orders,
            inlets=[orders, alias],
            owner="me",
            doc_md="doc",
            task_display_name="Op",
            trigger_rule="all_success",
            params={"x": 1},
            pool="default_pool",
            email_on_failure=False,
        )
        Noop(task_id="op2", pool="other", priority_weight=3)
    assert op.outlets == [orders] and op.inlets == [orders, alias]
    assert (op.owner, op.doc_md, op.task_display_name) == ("me", "doc", "Op")
    assert op.trigger_rule is TriggerRule.ALL_SUCCESS and op.params["x"].value == 1
    assert (op.pool, op.pool_slots) == ("default_pool", 1)
    assert [r.argument for r in _ignored(caplog)] == ["priority_weight"]
    assert "Noop" in _ignored(caplog)[0].getMessage()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"trigger_rule": "sometimes"}, "trigger_rule 'sometimes' is not a trigger rule"),
        ({"trigger_rule": "sometimes"}, "'sometimes' is not a trigger rule"),
        ({"outlets": ["orders"]}, "outlets takes Asset and AssetAlias"),
        ({"inlets": 3}, "inlets takes Asset and AssetAlias"),
        ({"pre_execute": 3}, "pre_execute must be a callable, got 3"),
        ({"task_concurrency": 2}, "use max_active_tis_per_dag="),
        ({"retires": 2}, "Noop got an unknown argument 'retires'; did you mean 'retries'"),
    ],
)
def test_bad_operator_arguments(kwargs, match) -> None:
    with pytest.raises(DagDefinitionError, match=match):
        Noop(task_id="bad", **kwargs)


def test_task_decorator_takes_operator_arguments() -> None:
    from engine import Asset

    @task(outlets=[Asset("a")], retries=4, owner="o")
    def produce() -> None:
        """Produces a."""

    with DAG("td", auto_register=False):
        made = produce()
    assert (made.retries, made.owner, made.doc_md) == (4, "o", "Produces a.")
    assert [a.name for a in made.outlets] == ["a"]


def test_empty_operator_does_nothing() -> None:
    assert EmptyOperator(task_id="e").execute({}) is None
    assert isinstance(PythonOperator(task_id="p", python_callable=print), BaseOperator)


def test_port_file_reaches_the_dag_processor_shape(tmp_path) -> None:
    source = textwrap.dedent(
        """
        import pendulum
        from engine import DAG, EmptyOperator
        with DAG("plain", start_date=pendulum.datetime(2025, 1, 1), schedule="0 * * * *"):
            EmptyOperator(task_id="only")
        """
    )
    path = tmp_path / "plain.py"
    path.write_text(source)
    (parsed,) = collect_dags(import_dag_file(path), str(path))
    assert parsed.timetable is not None and parsed.timetable.summary == "0 * * * *"
    assert parsed.fileloc == str(path)


def test_a_trigger_rule_set_after_construction_is_checked_not_ignored() -> None:
    from engine import DAG, EmptyOperator, TriggerRule

    with DAG("late_rule"):
        op = EmptyOperator(task_id="t")
    op.trigger_rule = TriggerRule.ALL_SUCCESS
    assert op.trigger_rule == TriggerRule.ALL_SUCCESS
    op.trigger_rule = TriggerRule.ALL_DONE
    assert op.trigger_rule == TriggerRule.ALL_DONE
    with pytest.raises(DagDefinitionError, match="'sometimes' is not a trigger rule"):
        op.trigger_rule = "sometimes"
    assert op.trigger_rule == TriggerRule.ALL_DONE
