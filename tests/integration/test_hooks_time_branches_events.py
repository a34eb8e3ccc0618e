"""On SQLite and PostgreSQL with the real scheduler and executor in-process: an operator's
``pre_execute`` / ``post_execute`` (arguments and methods) around ``execute``;
``BranchDateTimeOperator`` and ``BranchDayOfWeekOperator`` on runs at fixed logical dates;
the runs an ``EventsTimetable`` gives (catchup or not, and a manual run restricted to its
events)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
import pytest

from engine.db import models
from engine.states import TaskState
from engine.views import operations
from tests.integration.inprocess_engine import InProcessEngine
from tests.waiting import eventually

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

OK, SKIP, FAILED = TaskState.SUCCESS, TaskState.SKIPPED, TaskState.FAILED

DAGS = """
from datetime import UTC, datetime, time
from pathlib import Path

from engine import (
    DAG,
    BaseOperator,
    BranchDateTimeOperator,
    BranchDayOfWeekOperator,
    EmptyOperator,
    EventsTimetable,
    PythonOperator,
    WeekDay,
)
from engine.exceptions import AirflowSkipException

HERE = Path(__file__).parent


def note(what):
    with open(HERE / "order.txt", "a") as out:
        out.write(what + "\\n")


class Hooked(BaseOperator):
    def pre_execute(self, context):
        note("method pre")

    def execute(self, context):
        note("execute")
        return 7

    def post_execute(self, context, result=None):
        note(f"method post {result}")


def skip(context):
    raise AirflowSkipException("not today")


def fail_after(context, result):
    raise ValueError(f"rejected {result}")


with DAG("hooks"):
    Hooked(
        task_id="hooked",
        pre_execute=lambda context: note(f"arg pre {context['task'].task_id}"),
        post_execute=lambda context, result: note(f"arg post {result}"),
        on_execute_callback=lambda context: note("on_execute_callback"),
    )
    PythonOperator(task_id="skipped", python_callable=lambda: note("never"), pre_execute=skip)
    PythonOperator(task_id="rejected", python_callable=lambda: 5, post_execute=fail_after)


with DAG("time_branches"):
    office = BranchDateTimeOperator(
        task_id="office_hours",
        follow_task_ids_if_true="work",
        follow_task_ids_if_false=["rest"],
        target_lower=time(9, 0),
        target_upper=time(17, 0),
        use_task_logical_date=True,
    )
    office >> [EmptyOperator(task_id="work"), EmptyOperator(task_id="rest")]
    night = BranchDateTimeOperator(
        task_id="night",
        follow_task_ids_if_true="night_shift",
        follow_task_ids_if_false="day_shift",
        target_lower=time(22, 0),
        target_upper=time(7, 0),  # before lower: the window ends the next day
        use_task_logical_date=True,
    )
    night >> [EmptyOperator(task_id="night_shift"), EmptyOperator(task_id="day_shift")]
    day = BranchDayOfWeekOperator(
        task_id="weekday",
        follow_task_ids_if_true="early_week",
        follow_task_ids_if_false="late_week",
        week_day={WeekDay.MONDAY, "Tuesday"},
        use_task_logical_date=True,
    )
    day >> [EmptyOperator(task_id="early_week"), EmptyOperator(task_id="late_week")]


PAST = [datetime(2026, 1, 5, 12, tzinfo=UTC), datetime(2026, 1, 2, 12, tzinfo=UTC)]
FUTURE = datetime(2999, 1, 1, tzinfo=UTC)

with DAG(
    "events",
    schedule=EventsTimetable([*PAST, PAST[0], FUTURE], description="Match days"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=True,
):
    EmptyOperator(task_id="play")

with DAG(
    "events_no_catchup",
    schedule=EventsTimetable([*PAST, FUTURE], restrict_to_events=True, presorted=False),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
):
    EmptyOperator(task_id="play")
"""


@pytest.fixture
def engine(migrated_db_url: str, tmp_path: Path):
    engine = InProcessEngine(migrated_db_url, tmp_path, {"hops_dags.py": DAGS})
    yield engine
    engine.db.dispose()


@pytest.mark.both_databases
async def test_pre_and_post_execute_run_around_execute(engine: InProcessEngine) -> None:
    run_pk = engine.trigger("hooks")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["failed"]
    assert (engine.dags / "order.txt").read_text().splitlines() == [
        "arg pre hooked",
        "method pre",
        "on_execute_callback",  # after pre_execute, as Airflow 3
        "execute",
        "arg post 7",
        "method post 7",
    ]
    assert engine.states(run_pk) == {"hooked": OK, "skipped": SKIP, "rejected": FAILED}
    assert engine.xcom(run_pk, "hooked") == 7
    assert "ValueError: rejected 5" in engine.log(run_pk, "rejected")


@pytest.mark.both_databases
async def test_time_branches_follow_the_logical_date(engine: InProcessEngine) -> None:
    monday_6 = engine.trigger("time_branches", logical_date=datetime(2026, 3, 2, 6, tzinfo=UTC))
    tuesday_23 = engine.trigger("time_branches", logical_date=datetime(2026, 3, 3, 23, tzinfo=UTC))
    thursday_12 = engine.trigger("time_branches", logical_date=datetime(2026, 3, 5, 12, tzinfo=UTC))
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(monday_6, tuesday_23, thursday_12) == ["success"] * 3

    def followed(run_pk: int) -> list[str]:
        states = engine.states(run_pk)
        return sorted(
            t
            for t in ("work", "rest", "night_shift", "day_shift", "early_week", "late_week")
            if states[t] == OK
        )

    # 06:00 is before 22:00 of its own day: Airflow's window is [22:00, 07:00 the next day]
    assert followed(monday_6) == ["day_shift", "early_week", "rest"]
    assert followed(tuesday_23) == ["early_week", "night_shift", "rest"]
    assert followed(thursday_12) == ["day_shift", "late_week", "work"]
    assert engine.states(monday_6)["work"] == SKIP


async def test_events_timetable_runs_each_event_once(engine: InProcessEngine) -> None:
    async def two_runs() -> list | None:
        await engine.scheduler.schedule_once()
        found = engine.runs_of("events")
        return found if len(found) == 2 else None

    with anyio.fail_after(60):
        scheduled = await eventually(two_runs, within=30, step=0.05)
        await engine.scheduler.schedule_once()
    assert [r.logical_date for r in scheduled] == [
        datetime(2026, 1, 2, 12, tzinfo=UTC),
        datetime(2026, 1, 5, 12, tzinfo=UTC),
    ]
    assert all(r.run_type == "scheduled" for r in scheduled)
    assert all(r.data_interval_start == r.data_interval_end == r.logical_date for r in scheduled)
    assert len(engine.runs_of("events")) == 2  # the duplicate event is one run
    assert engine.runs_of("events_no_catchup") == []  # catchup=False: past events are skipped

    def dag_row(session, dag_id):
        return session.get(models.Dag, dag_id)

    events = engine.db.call(lambda s: dag_row(s, "events"))
    assert events.next_dagrun == datetime(2999, 1, 1, tzinfo=UTC)
    assert events.timetable_summary == "Match days"

    manual = engine.db.call(
        lambda s: operations.trigger_dag(
            s, "events_no_catchup", conf=None, logical_date=None, now=models.utcnow()
        )
    )
    [run] = engine.runs_of("events_no_catchup")
    assert run.run_id == manual["run_id"]
    # restrict_to_events: a manual run covers the most recent event
    assert run.data_interval_start == run.data_interval_end == datetime(2026, 1, 5, 12, tzinfo=UTC)
