"""Definition-time checks and pure decisions of ``BranchDateTimeOperator``,
``BranchDayOfWeekOperator``, ``TriggerDagRunOperator``, ``ExternalTaskMarker``, the
``pre_execute`` / ``post_execute`` arguments and mapped task groups."""

from __future__ import annotations

from datetime import UTC, datetime, time
from types import SimpleNamespace

import pytest

from engine import (
    DAG,
    BranchDateTimeOperator,
    BranchDayOfWeekOperator,
    EmptyOperator,
    ExternalTaskMarker,
    TriggerDagRunOperator,
    task,
    task_group,
)
from engine.authoring.datetime_branch import target_times_as_dates
from engine.authoring.errors import DagDefinitionError
from engine.authoring.mapped_groups import GroupMappedOperator

MONDAY_6 = datetime(2026, 3, 2, 6, tzinfo=UTC)


def test_time_bounds_take_the_compared_day_and_a_window_over_midnight_ends_the_next_day() -> None:
    assert target_times_as_dates(MONDAY_6, time(9), time(17)) == (
        datetime(2026, 3, 2, 9),
        datetime(2026, 3, 2, 17),
    )
    assert target_times_as_dates(MONDAY_6, time(22), time(7)) == (
        datetime(2026, 3, 2, 22),
        datetime(2026, 3, 3, 7),
    )
    assert target_times_as_dates(MONDAY_6, None, time(7)) == (None, datetime(2026, 3, 2, 7))


def _choose(op, logical_date):
    return op.choose_branch({"logical_date": logical_date, "dag_run": SimpleNamespace()})


def test_branches_choose_by_the_logical_date() -> None:
    with DAG("d"):
        office = BranchDateTimeOperator(
            task_id="office",
            follow_task_ids_if_true="work",
            follow_task_ids_if_false=["rest", "sleep"],
            target_lower=time(9),
            target_upper=time(17),
            use_task_logical_date=True,
        )
        weekend = BranchDayOfWeekOperator(
            task_id="weekend",
            follow_task_ids_if_true="relax",
            follow_task_ids_if_false="work",
            week_day={"Saturday", "Sunday"},
            use_task_logical_date=True,
        )
    assert _choose(office, MONDAY_6) == ["rest", "sleep"]
    assert _choose(office, MONDAY_6.replace(hour=12)) == ["work"]
    assert _choose(weekend, MONDAY_6) == ["work"]
    assert _choose(weekend, datetime(2026, 3, 7, tzinfo=UTC)) == ["relax"]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: BranchDateTimeOperator(
                task_id="b", follow_task_ids_if_true="a", follow_task_ids_if_false="c"
            ),
            "at least one must be defined",
        ),
        (
            lambda: BranchDateTimeOperator(
                task_id="b",
                follow_task_ids_if_true="a",
                follow_task_ids_if_false="c",
                target_lower="09:00",
            ),
            "target_lower must be a datetime, a time or None",
        ),
        (
            lambda: BranchDayOfWeekOperator(
                task_id="b", follow_task_ids_if_true="a", follow_task_ids_if_false=[], week_day=1
            ),
            "task 'b'",
        ),
        (
            lambda: TriggerDagRunOperator(task_id="t", trigger_dag_id=""),
            "trigger_dag_id must be a DAG id",
        ),
        (
            lambda: TriggerDagRunOperator(task_id="t", trigger_dag_id="x", allowed_states=["ok"]),
            r"allowed_states \['ok'\] are not DAG run states",
        ),
        (
            lambda: TriggerDagRunOperator(task_id="t", trigger_dag_id="x", wait_for_completion=1),
            "wait_for_completion must be True, False or a template",
        ),
        (
            lambda: TriggerDagRunOperator(task_id="t", trigger_dag_id="x", logical_date=3),
            "logical_date must be a datetime, an ISO string or None",
        ),
        (
            lambda: ExternalTaskMarker(
                task_id="m", external_dag_id="x", external_task_id="y", recursion_depth=0
            ),
            "recursion_depth should be a positive integer",
        ),
        (
            lambda: EmptyOperator(task_id="e", post_execute="print"),
            "post_execute must be a callable",
        ),
    ],
)
def test_bad_arguments_name_the_task(make, match) -> None:
    with DAG("d"), pytest.raises(DagDefinitionError, match=match):
        make()


def test_a_marker_keeps_airflows_default_logical_date_template() -> None:
    with DAG("d"):
        marker = ExternalTaskMarker(task_id="m", external_dag_id="x", external_task_id="y")
    assert marker.logical_date == "{{ logical_date.isoformat() }}"
    assert marker.recursion_depth == 10
    assert set(marker.template_fields) == {"external_dag_id", "external_task_id", "logical_date"}


@task
def add(x, y):
    return x + y


def test_a_mapped_group_maps_each_of_its_tasks_over_the_group_input() -> None:
    @task
    def numbers():
        return [1, 2]

    with DAG("d") as dag:

        @task_group
        def grp(x, y):
            return add(add(x, y), y)

        out = grp.partial(y=1).expand(x=numbers())
        EmptyOperator(task_id="after").set_upstream(out)
    mapped = [t for t in dag.tasks if isinstance(t, GroupMappedOperator)]
    assert [t.task_id for t in mapped] == ["grp.add", "grp.add__1"]
    assert all(
        t.mapping_json()
        == {
            "kind": "expand",
            "args": [{"name": "x", "task_id": "numbers", "key": "return_value"}],
            "group": ["grp.add", "grp.add__1"],  # whose copies pair up (per map_index)
        }
        for t in mapped
    )
    assert dag.task_dict["grp.add"].upstream_task_ids == {"numbers"}
    assert dag.task_dict["grp.add__1"].downstream_task_ids == {"after"}


def test_mapped_group_errors() -> None:
    with DAG("d"):

        @task_group
        def grp(x):
            add.partial(y=1).expand(x=[x])

        with pytest.raises(DagDefinitionError, match="has no parameter 'z'"):
            grp.expand(z=[1])
        with pytest.raises(DagDefinitionError, match="give at least one argument"):
            grp.expand()
        with pytest.raises(DagDefinitionError, match="given to both partial"):
            grp.partial(x=1).expand(x=[2])
        with pytest.raises(DagDefinitionError, match="mapped inside a mapped task group"):
            grp.expand(x=[1, 2])


def test_trigger_states_default_as_airflow() -> None:
    with DAG("d"):
        empty = TriggerDagRunOperator(
            task_id="t", trigger_dag_id="x", allowed_states=[], failed_states=[]
        )
        default = TriggerDagRunOperator(task_id="u", trigger_dag_id="x")
    assert (empty.allowed_states, empty.failed_states) == (["success"], [])
    assert (default.allowed_states, default.failed_states) == (["success"], ["failed"])
