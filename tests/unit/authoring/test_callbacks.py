"""Callback and pool arguments of tasks and DAGs, which callback an outcome calls, and how
callbacks run (a raising one is logged and the next still runs)."""

from __future__ import annotations

import logging

import pytest

from engine import DAG, PythonOperator
from engine.authoring.callbacks import as_callbacks
from engine.authoring.errors import DagDefinitionError
from engine.execution.callbacks import outcome_callback_kind, run_callbacks


def first(context: object) -> None:
    return None


def second(context: object) -> None:
    return None


def test_a_callback_argument_is_a_callable_or_a_list_of_them() -> None:
    assert as_callbacks("here", "on_success_callback", None) == []
    assert as_callbacks("here", "on_success_callback", first) == [first]
    assert as_callbacks("here", "on_success_callback", (first, second)) == [first, second]
    with pytest.raises(DagDefinitionError, match=r"here: on_retry_callback must be a callable"):
        as_callbacks("here", "on_retry_callback", [first, "not callable"])


def test_task_and_dag_arguments_including_default_args() -> None:
    with DAG(
        "cb",
        on_failure_callback=first,
        default_args={"on_failure_callback": second, "pool": "etl", "pool_slots": 2},
        auto_register=False,
    ) as dag:
        plain = PythonOperator(task_id="plain", python_callable=print)
        own = PythonOperator(
            task_id="own",
            python_callable=print,
            on_failure_callback=[first],
            on_execute_callback=second,
            pool="other",
            pool_slots=1,
        )
    assert dag.on_failure_callback == [first] and dag.on_success_callback == []
    assert plain.on_failure_callback == [second] and (plain.pool, plain.pool_slots) == ("etl", 2)
    assert own.on_failure_callback == [first] and own.on_execute_callback == [second]
    assert (own.pool, own.pool_slots) == ("other", 1) and own.on_skipped_callback == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pool": ""}, "pool must be a non-empty pool name"),
        ({"pool": 3}, "pool must be a non-empty pool name"),
        ({"pool_slots": 0}, "pool_slots must be an int >= 1, got 0"),
        ({"pool_slots": True}, "pool_slots must be an int >= 1"),
        ({"on_success_callback": "notify"}, "on_success_callback must be a callable"),
    ],
)
def test_bad_task_arguments_name_what_is_wrong(kwargs: dict[str, object], match: str) -> None:
    with (
        DAG("bad", auto_register=False),
        pytest.raises(DagDefinitionError, match=rf"task 't'.*{match}"),
    ):
        PythonOperator(task_id="t", python_callable=print, **kwargs)


@pytest.mark.parametrize(
    ("outcome", "no_retry", "try_number", "max_tries", "kind"),
    [
        ("success", False, 1, 0, "on_success_callback"),
        ("skipped", False, 1, 0, "on_skipped_callback"),
        ("deferred", False, 1, 0, None),
        ("failed", False, 1, 1, "on_retry_callback"),  # tries left
        ("failed", False, 2, 1, "on_failure_callback"),  # the last try
        ("failed", True, 1, 3, "on_failure_callback"),  # AirflowFailException
        ("failed", False, 1, None, "on_failure_callback"),  # unknown retries: no retry
    ],
)
def test_which_callback_an_outcome_calls(
    outcome: str, no_retry: bool, try_number: int, max_tries: int | None, kind: str | None
) -> None:
    found = outcome_callback_kind(
        outcome, no_retry=no_retry, try_number=try_number, max_tries=max_tries
    )
    assert found == kind


def test_a_raising_callback_is_logged_and_the_next_still_runs(caplog) -> None:
    calls: list[object] = []

    def boom(context: object) -> None:
        raise RuntimeError("no")

    with caplog.at_level(logging.INFO, logger="engine.authoring.callbacks"):
        errors = run_callbacks([boom, calls.append], {"k": 1}, what="task 't' on_success_callback")
    assert calls == [{"k": 1}]
    assert len(errors) == 1 and "RuntimeError: no" in errors[0]
    failed = [r for r in caplog.records if getattr(r, "action", "") == "callback_failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None


def test_queue_names_the_celery_queue_of_a_task() -> None:
    with DAG("q", default_args={"queue": "etl"}, auto_register=False):
        plain = PythonOperator(task_id="plain", python_callable=print)
        own = PythonOperator(task_id="own", python_callable=print, queue="gpu")
    with DAG("none", auto_register=False):
        default = PythonOperator(task_id="default", python_callable=print)
    assert (plain.queue, own.queue, default.queue) == ("etl", "gpu", None)
    for bad in ("", "  ", 3):
        with (
            DAG("bad", auto_register=False),
            pytest.raises(DagDefinitionError, match=r"task 't'.*queue must be a non-empty"),
        ):
            PythonOperator(task_id="t", python_callable=print, queue=bad)
