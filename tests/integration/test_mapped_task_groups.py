"""Mapped task groups (``@task_group`` + ``.partial`` / ``.expand``) on SQLite and
PostgreSQL, with the real scheduler and executor in-process: every task of the group gets
one copy per item, copy ``i`` of a task receives copy ``i`` of the group task upstream of it,
and a task downstream of the group receives the list of the copies' results; ``expand_kwargs``
maps over dicts of arguments. The scheduler decides each copy on its own: a failed copy fails
the same index below it and no other, and ``xcom_pull`` inside the group reads the same
copy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from engine.states import TaskState
from tests.integration.inprocess_engine import InProcessEngine

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

OK = TaskState.SUCCESS

DAGS = """
from engine import DAG, PythonOperator, task, task_group


@task
def numbers():
    return [1, 2, 3]


@task
def add_one(x):
    return x + 1


@task
def times(x, k):
    return x * k


@task
def total(values):
    return {"values": values, "sum": sum(values)}


with DAG("mapped_group"):

    @task_group
    def scale(x, k):
        return times(add_one(x), k)

    total(scale.partial(k=10).expand(x=numbers()))


def show(letter, number):
    return f"{letter}{number}"


with DAG("cross_group"):

    @task_group(group_id="pairs")
    def pair(letter, number):
        PythonOperator(task_id="show", python_callable=show, op_args=[letter, number])

    pair.expand(letter=["x", "y"], number=[1, 2])

with DAG("kwargs_group"):

    @task
    def rows():
        return [{"x": 1, "k": 12}, {"x": 1, "k": 23}, {"x": 2}]  # the last: k's default

    @task_group
    def scaled(x, k=2):
        return times(x, k)

    total(scaled.expand_kwargs(rows()))

@task
def check(x):
    if x == 2:
        raise ValueError("copy 1 fails")
    return x


@task
def double(x):
    return x * 2


@task(trigger_rule="all_done")
def collect(values):
    return values


with DAG("per_copy_group"):

    @task_group
    def pipeline(x):
        return double(check(x))

    collect(pipeline.expand(x=[1, 2, 3]))


@task
def pulled(ti=None):
    return ti.xcom_pull(task_ids="pulls.add_one")


with DAG("group_pull"):

    @task_group(group_id="pulls")
    def pulls(x):
        add_one(x) >> pulled()

    pulls.expand(x=[10, 20])

with DAG("empty_group"):

    @task_group
    def nothing(x):
        return add_one(x)

    total(nothing.expand(x=[]))
"""


@pytest.fixture
def engine(migrated_db_url: str, tmp_path: Path):
    engine = InProcessEngine(migrated_db_url, tmp_path, {"mapped_groups.py": DAGS})
    yield engine
    engine.db.dispose()


@pytest.mark.both_databases
async def test_a_mapped_group_of_three_runs_each_task_per_item_and_reduces(
    engine: InProcessEngine,
) -> None:
    run_pk = engine.trigger("mapped_group")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]
    assert engine.states(run_pk) == {
        "numbers": OK,
        "scale.add_one[0]": OK,
        "scale.add_one[1]": OK,
        "scale.add_one[2]": OK,
        "scale.times[0]": OK,
        "scale.times[1]": OK,
        "scale.times[2]": OK,
        "total": OK,
    }
    assert [engine.xcom(run_pk, "scale.add_one", map_index=i) for i in range(3)] == [2, 3, 4]
    # copy i of `times` got copy i of `add_one`, and `k` from partial()
    assert [engine.xcom(run_pk, "scale.times", map_index=i) for i in range(3)] == [20, 30, 40]
    assert engine.xcom(run_pk, "total") == {"values": [20, 30, 40], "sum": 90}


async def test_a_group_over_two_arguments_runs_their_cross_product(engine: InProcessEngine) -> None:
    run_pk = engine.trigger("cross_group")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]
    shown = [engine.xcom(run_pk, "pairs.show", map_index=i) for i in range(4)]
    assert shown == ["x1", "x2", "y1", "y2"]


async def test_a_group_over_nothing_is_skipped(engine: InProcessEngine) -> None:
    run_pk = engine.trigger("empty_group")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]
    assert engine.states(run_pk) == {"nothing.add_one": "skipped", "total": "skipped"}


async def test_a_group_over_dicts_of_arguments_takes_defaults_for_missing_keys(
    engine: InProcessEngine,
) -> None:
    run_pk = engine.trigger("kwargs_group")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]
    assert engine.xcom(run_pk, "total") == {"values": [12, 23, 4], "sum": 39}


@pytest.mark.both_databases
async def test_a_failed_copy_fails_only_its_own_index_below_it(engine: InProcessEngine) -> None:
    run_pk = engine.trigger("per_copy_group")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]  # its leaf, all_done, ran
    assert engine.states(run_pk) == {
        "pipeline.check[0]": OK,
        "pipeline.check[1]": TaskState.FAILED,
        "pipeline.check[2]": OK,
        "pipeline.double[0]": OK,
        "pipeline.double[1]": TaskState.UPSTREAM_FAILED,
        "pipeline.double[2]": OK,
        "collect": OK,
    }
    assert engine.xcom(run_pk, "collect") == [2, 6]  # the successful copies' results


async def test_xcom_pull_inside_the_group_reads_the_same_copy(engine: InProcessEngine) -> None:
    run_pk = engine.trigger("group_pull")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]
    assert [engine.xcom(run_pk, "pulls.pulled", map_index=i) for i in range(2)] == [11, 21]
