"""Results between tasks, a branch, a trigger rule, a retry delay and a templated Bash task.

``extract`` returns orders; ``summarize`` receives them (TaskFlow: calling a task with
another's result makes it upstream and passes the value) and returns a dict, stored key by
key (``multiple_outputs``, inferred from the annotation). ``choose`` branches on the total:
one of ``big_day`` / ``quiet_day`` runs, the other is skipped, and ``report`` joins them with
``none_failed_min_one_success``. ``archive`` is a BashOperator whose command is a Jinja
template of the run's date and an upstream result.

Try it (with ``make run`` going):

    .venv/bin/sluice dags trigger example_taskflow_branch --conf '{"threshold": 10}'
    .venv/bin/sluice runs list example_taskflow_branch         # which branch ran
    .venv/bin/sluice tasks result example_taskflow_branch <RUN_ID> summarize
    .venv/bin/sluice tasks logs example_taskflow_branch <RUN_ID> archive
"""

from __future__ import annotations

from datetime import datetime, timedelta

from engine import BashOperator, Param, TriggerRule, dag, task


@dag(
    schedule=None,
    start_date=datetime(2026, 1, 1),
    params={"threshold": Param(100, type="integer", minimum=0)},
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    tags=["example", "taskflow"],
)
def example_taskflow_branch() -> None:
    @task
    def extract() -> list[int]:
        return [12, 30, 7]

    @task
    def summarize(orders: list[int]) -> dict[str, int]:
        return {"total": sum(orders), "count": len(orders)}

    @task.branch
    def choose(total: int, params: dict) -> str:  # type: ignore[type-arg]
        return "big_day" if total >= params["threshold"] else "quiet_day"

    @task
    def big_day(total: int) -> str:
        return f"big day: {total}"

    @task
    def quiet_day(total: int) -> str:
        return f"quiet day: {total}"

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def report(ti) -> list[str]:  # type: ignore[no-untyped-def]
        picked = ti.xcom_pull(task_ids=["big_day", "quiet_day"], default=None)
        return [line for line in picked if line is not None]

    summary = summarize(extract())
    branch = choose(summary["total"])
    big, quiet = big_day(summary["total"]), quiet_day(summary["total"])
    joined = report()
    branch >> [big, quiet]
    [big, quiet] >> joined
    count = "{{ ti.xcom_pull(task_ids='summarize', key='count') }}"
    archive = BashOperator(
        task_id="archive",
        bash_command="echo 'archiving {{ ds }}: " + count + " orders'",
    )
    joined >> archive


example_taskflow_branch()
