"""Deadline alerts, the pure parts: what a DAG file may declare (and the errors for what it
may not), the alerts' JSON, and when each reference puts a run's deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import pytest

from engine import (
    DAG,
    AsyncCallback,
    DagDefinitionError,
    DeadlineAlert,
    DeadlineReference,
    SyncCallback,
    dag,
)
from engine.authoring.dag import take_registered_dags
from engine.db.queries.deadlines import RunToSet
from engine.scheduler.deadlines import deadline_rows, reference_time

if TYPE_CHECKING:
    from collections.abc import Iterator

QUEUED = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_registered_dags() -> Iterator[None]:
    yield
    take_registered_dags()


async def notify(context: dict[str, Any], **kwargs: Any) -> None:
    return None


def plain(context: dict[str, Any], **kwargs: Any) -> None:
    return None


def _alert(reference: Any = None, **kwargs: Any) -> DeadlineAlert:
    return DeadlineAlert(
        reference=reference or DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(minutes=15),
        callback=AsyncCallback(notify, kwargs=kwargs),
    )


def test_a_dag_stores_its_alerts_as_json() -> None:
    with DAG("d", deadline=_alert(channel="#ops")) as d:
        pass
    (alert,) = d.deadline
    assert alert.serialize() == {
        "reference": {"reference_type": "DagRunQueuedAtDeadline"},
        "interval_s": 900.0,
        "callback": {"kind": "async", "path": f"{__name__}.notify", "kwargs": {"channel": "#ops"}},
        "name": None,
    }

    @dag(deadline=[_alert(), _alert(DeadlineReference.AVERAGE_RUNTIME(max_runs=5, min_runs=3))])
    def decorated() -> None:
        pass

    assert [a.reference.reference_name for a in decorated().deadline] == [
        "DagRunQueuedAtDeadline",
        "AverageRuntimeDeadline",
    ]


def test_a_naive_fixed_datetime_is_read_in_the_dags_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    naive = DeadlineReference.FIXED_DATETIME(datetime(2030, 6, 1, 9, 0))
    with DAG("d", start_date=datetime(2030, 1, 1, tzinfo=berlin), deadline=_alert(naive)) as d:
        pass
    stored = d.deadline[0].reference.serialize_reference()
    assert datetime.fromtimestamp(stored["datetime"], tz=UTC) == datetime(2030, 6, 1, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AsyncCallback(plain), "an AsyncCallback takes an async def"),
        (lambda: AsyncCallback(lambda context: None), "AsyncCallback takes an async def"),
        (lambda: SyncCallback(plain, kwargs={"context": 1}), "context is a reserved kwarg"),
        (lambda: SyncCallback(plain, kwargs={"when": datetime.now()}), "must be JSON data"),
        (lambda: SyncCallback("not a path"), "dotted path"),
        (lambda: SyncCallback(plain, executor="celery"), "leave executor out"),
        (
            lambda: DeadlineAlert(DeadlineReference.DAGRUN_QUEUED_AT, 60, SyncCallback(plain)),
            "timedelta",
        ),
        (lambda: DeadlineAlert("queued", timedelta(1), SyncCallback(plain)), "reference"),
        (
            lambda: DeadlineAlert(DeadlineReference.DAGRUN_QUEUED_AT, timedelta(1), plain),
            "callback",
        ),
        (lambda: DeadlineReference.AVERAGE_RUNTIME(max_runs=5, min_runs=0), "min_runs"),
        (lambda: DAG("d", deadline="soon"), "deadline must be a DeadlineAlert"),
    ],
)
def test_what_cannot_work_is_refused(build: Any, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        build()


def test_a_path_that_does_not_import_here_is_kept_for_the_callback_process() -> None:
    callback = SyncCallback("somewhere.else.notify", kwargs={"a": 1})
    assert (callback.path, callback.callable) == ("somewhere.else.notify", None)


@pytest.mark.parametrize(
    ("reference", "logical", "durations", "expected"),
    [
        ({"reference_type": "DagRunQueuedAtDeadline"}, None, None, QUEUED),
        (
            {"reference_type": "DagRunLogicalDateDeadline"},
            QUEUED - timedelta(days=1),
            None,
            QUEUED - timedelta(days=1),
        ),
        ({"reference_type": "DagRunLogicalDateDeadline"}, None, None, None),
        (
            {"reference_type": "FixedDatetimeDeadline", "datetime": 1893456000.0},
            None,
            None,
            datetime(2030, 1, 1, tzinfo=UTC),
        ),
        (
            {"reference_type": "AverageRuntimeDeadline", "max_runs": 3, "min_runs": 2},
            None,
            [60.0, 120.0],
            QUEUED + timedelta(seconds=90),
        ),
        (
            {"reference_type": "AverageRuntimeDeadline", "max_runs": 3, "min_runs": 3},
            None,
            [60.0, 120.0],
            None,
        ),  # too few finished runs: no deadline
    ],
)
def test_each_reference_puts_the_deadline(
    reference: dict[str, Any], logical: datetime | None, durations: Any, expected: Any
) -> None:
    at = reference_time(reference, logical_date=logical, queued_at=QUEUED, durations_s=durations)
    assert at == expected


def test_the_interval_is_added_and_an_unreadable_alert_gets_no_deadline() -> None:
    run = RunToSet(
        7,
        "d",
        "r",
        None,
        QUEUED,
        (
            {"reference": {"reference_type": "DagRunQueuedAtDeadline"}, "interval_s": -60.0},
            {"reference": {"reference_type": "Martian"}, "interval_s": 1.0},
        ),
    )
    first, second = deadline_rows(run, {}, QUEUED)
    assert first["deadline_time"] == QUEUED - timedelta(minutes=1)  # before the reference
    assert (second["deadline_time"], second["reference"]) == (None, "Martian")
