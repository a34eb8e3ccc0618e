"""Branching on the time (Airflow's standard provider): ``BranchDateTimeOperator`` and
``BranchDayOfWeekOperator``.

::

    BranchDateTimeOperator(
        task_id="office_hours",
        follow_task_ids_if_true=["work"],
        follow_task_ids_if_false="rest",
        target_lower=time(9, 0),
        target_upper=time(17, 0),
    )
    BranchDayOfWeekOperator(
        task_id="weekend",
        follow_task_ids_if_true="relax",
        follow_task_ids_if_false="work",
        week_day={WeekDay.SATURDAY, WeekDay.SUNDAY},
    )

Both are ``BaseBranchOperator``s (``engine.authoring.branching``): the direct downstream
tasks not followed are skipped with the task's success. The moment compared is the current
time, or with ``use_task_logical_date=True`` the run's logical date (a run without one uses
its ``run_after``), as in Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from engine.authoring.arguments import check_type
from engine.authoring.branching import BaseBranchOperator
from engine.authoring.context import as_moment
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.standard_sensors import WeekDay

if TYPE_CHECKING:
    from datetime import tzinfo

    from engine.authoring.context import Context

__all__ = ("BranchDateTimeOperator", "BranchDayOfWeekOperator", "target_times_as_dates")

Target = datetime | time | None


def _follow_ids(where: str, name: str, value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, bytes | dict):
        ids = list(value)  # empty: follow nothing, every direct downstream task is skipped
        if all(isinstance(task_id, str) for task_id in ids):
            return ids
    raise DagDefinitionError(f"{where}: {name} must be a task id or a list of task ids")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _moment(context: Context, use_task_logical_date: bool) -> datetime:
    """The time a branch compares: now, or the run's logical date (else its ``run_after``)."""
    if not use_task_logical_date:
        return _utcnow()
    run = context.get("dag_run")
    moment = as_moment(context.get("logical_date")) or as_moment(getattr(run, "run_after", None))
    return moment or _utcnow()


def target_times_as_dates(
    base: datetime, lower: Target, upper: Target
) -> tuple[datetime | None, datetime | None]:
    """``lower`` and ``upper`` as datetimes: a ``time`` is taken on ``base``'s day; when both
    are given and ``upper`` falls before ``lower``, the window ends the next day (22:00 to
    02:00 spans midnight)."""
    if isinstance(lower, datetime) and isinstance(upper, datetime):
        return lower, upper
    low = datetime.combine(base.date(), lower) if isinstance(lower, time) else lower
    high = datetime.combine(base.date(), upper) if isinstance(upper, time) else upper
    if low is not None and high is not None and high < low:
        high += timedelta(days=1)
    return low, high


def _aware(moment: datetime | None, zone: tzinfo) -> datetime | None:
    """``moment`` with the DAG's time zone when it has none."""
    if moment is None or moment.utcoffset() is not None:
        return moment
    return moment.replace(tzinfo=zone)


class BranchDateTimeOperator(BaseBranchOperator):
    """Follows ``follow_task_ids_if_true`` while the time is within ``[target_lower,
    target_upper]`` and ``follow_task_ids_if_false`` otherwise.

    Each bound is a ``datetime``, a ``time`` (on the compared moment's day) or None (open on
    that side); at least one must be set. Naive bounds are in the DAG's time zone.
    """

    def __init__(
        self,
        *,
        follow_task_ids_if_true: str | Iterable[str],
        follow_task_ids_if_false: str | Iterable[str],
        target_lower: datetime | time | None = None,
        target_upper: datetime | time | None = None,
        use_task_logical_date: bool = False,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        if target_lower is None and target_upper is None:
            raise DagDefinitionError(
                f"{where}: both target_upper and target_lower are None; at least one must "
                "be defined"
            )
        for name, bound in (("target_lower", target_lower), ("target_upper", target_upper)):
            if bound is not None and not isinstance(bound, datetime | time):
                raise DagDefinitionError(
                    f"{where}: {name} must be a datetime, a time or None, got {bound!r}"
                )
        check_type(where, "use_task_logical_date", use_task_logical_date, bool)
        true_ids = _follow_ids(where, "follow_task_ids_if_true", follow_task_ids_if_true)
        false_ids = _follow_ids(where, "follow_task_ids_if_false", follow_task_ids_if_false)
        super().__init__(**kwargs)
        self.follow_task_ids_if_true = true_ids
        self.follow_task_ids_if_false = false_ids
        self.target_lower = target_lower
        self.target_upper = target_upper
        self.use_task_logical_date = use_task_logical_date

    def choose_branch(self, context: Context) -> list[str]:
        now = _moment(context, self.use_task_logical_date)
        zone = self.dag.timezone if self.dag is not None else UTC
        lower, upper = target_times_as_dates(now, self.target_lower, self.target_upper)
        lower, upper = _aware(lower, zone), _aware(upper, zone)
        if upper is not None and upper < now:
            return self.follow_task_ids_if_false
        if lower is not None and lower > now:
            return self.follow_task_ids_if_false
        return self.follow_task_ids_if_true


class BranchDayOfWeekOperator(BaseBranchOperator):
    """Follows ``follow_task_ids_if_true`` on one of ``week_day`` (a name such as
    ``"Saturday"``, a ``WeekDay``, or a set of them) and ``follow_task_ids_if_false`` on the
    other days. The day is today's in the DAG's time zone, or the run's logical date's."""

    def __init__(
        self,
        *,
        follow_task_ids_if_true: str | Iterable[str],
        follow_task_ids_if_false: str | Iterable[str],
        week_day: str | WeekDay | Iterable[str | WeekDay],
        use_task_logical_date: bool = False,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        try:
            days = WeekDay.validate_week_day(week_day)
        except (TypeError, ValueError) as exc:
            raise DagDefinitionError(f"{where}: {exc}") from exc
        check_type(where, "use_task_logical_date", use_task_logical_date, bool)
        true_ids = _follow_ids(where, "follow_task_ids_if_true", follow_task_ids_if_true)
        false_ids = _follow_ids(where, "follow_task_ids_if_false", follow_task_ids_if_false)
        super().__init__(**kwargs)
        self.follow_task_ids_if_true = true_ids
        self.follow_task_ids_if_false = false_ids
        self.week_day = week_day
        self.use_task_logical_date = use_task_logical_date
        self._week_day_num = frozenset(days)

    def choose_branch(self, context: Context) -> list[str]:
        now = _moment(context, self.use_task_logical_date)
        if not self.use_task_logical_date and self.dag is not None:
            now = now.astimezone(self.dag.timezone)
        if now.isoweekday() in self._week_day_num:
            return self.follow_task_ids_if_true
        return self.follow_task_ids_if_false
