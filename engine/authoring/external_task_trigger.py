"""``ExternalTaskTrigger``: waits, in the triggerer, for tasks, a task group or a run of another
DAG to reach a state at given logical dates (what ``ExternalTaskSensor`` defers to).

Theory of operation. The task process has no database access by design, so the check of
another DAG's states runs where the database is: in the triggerer. A trigger that needs to
read the metadata database subclasses ``MetadataReadingTrigger``; the triggerer hands each
such trigger a ``MetadataReader`` (``attach_metadata``) before starting it. The reader is a
port: the triggerer's implementation (``engine.triggerer.metadata``) runs the queries of
``engine.db.queries.external_tasks`` in a worker thread; nothing here touches SQL. Every
``poke_interval`` seconds the trigger reads an ``ExternalStates`` snapshot and ``judge``
(a pure function) decides: failed (a state in ``failed_states``), skipped (in
``skipped_states``), success (everything in ``allowed_states`` at every logical date), not
found (``check_existence``), or wait. The event's payload is ``{"status", "message"}``; the
message names the external DAG, task(s) and logical date. This module is on the
triggerer's fixed list of engine trigger modules (``engine.loader``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio

from engine.states import TaskState
from triggers.base import BaseTrigger, TriggerEvent, classpath_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

logger = logging.getLogger(__name__)

#: the event's ``status`` when what is watched does not exist; otherwise the status is the
#: state it reached: ``success``, ``failed`` or ``skipped`` (``TaskState`` values)
NOT_FOUND: Final = "not_found"
MISSING_STATE: Final = TaskState.NONE.value  # a task instance (or run) that does not exist yet


@dataclass(frozen=True, slots=True)
class ExternalQuery:
    """What to read: a DAG's runs at ``logical_dates``, and its tasks (ids or a group)."""

    dag_id: str
    logical_dates: tuple[datetime, ...]
    task_ids: tuple[str, ...] | None = None
    task_group_id: str | None = None


@dataclass(frozen=True, slots=True)
class ExternalStates:
    """What the metadata database says now about an ``ExternalQuery``.

    ``known_task_ids``: the DAG's tasks (as last parsed) among ``task_ids`` or inside the
    group. ``run_states``: the state of the run at each logical date that has one.
    ``task_states``: at each logical date with a run, ``{task_id: state}`` of the asked
    tasks (the group's tasks) that have a task instance.
    """

    dag_exists: bool
    known_task_ids: frozenset[str]
    run_states: Mapping[datetime, str]
    task_states: Mapping[datetime, Mapping[str, str]]


class MetadataReader(Protocol):
    """Read access to the metadata database, given by the triggerer to engine triggers."""

    async def external_states(self, query: ExternalQuery) -> ExternalStates: ...


class MetadataReadingTrigger(BaseTrigger):
    """A trigger that reads the metadata database through the triggerer's ``MetadataReader``."""

    _metadata: MetadataReader | None = None

    def attach_metadata(self, reader: MetadataReader) -> None:
        """Called by the triggerer before ``run``."""
        self._metadata = reader

    def metadata(self) -> MetadataReader:
        """The attached reader; a clear error where no triggerer attached one."""
        if self._metadata is None:
            raise RuntimeError(
                f"{classpath_of(self)} reads the metadata database and runs only in the "
                "sluice triggerer, which gives it that access; none was attached"
            )
        return self._metadata


@dataclass(frozen=True, slots=True)
class Verdict:
    status: str
    message: str


@dataclass(frozen=True, slots=True)
class StateRules:
    allowed: frozenset[str]
    failed: frozenset[str]
    skipped: frozenset[str]
    check_existence: bool = False


def _what(query: ExternalQuery, ids: Sequence[str] | None = None) -> str:
    if query.task_group_id is not None:
        return f"task group {query.task_group_id!r} of DAG {query.dag_id!r}"
    if query.task_ids:
        shown = list(ids) if ids else list(query.task_ids)
        noun = "task" if len(shown) == 1 else "tasks"
        return f"{noun} {', '.join(map(repr, shown))} of DAG {query.dag_id!r}"
    return f"DAG {query.dag_id!r}"


def _states_at(query: ExternalQuery, states: ExternalStates, date: datetime) -> dict[str, str]:
    """``{name: state}`` of what is watched at ``date`` (the run itself for a whole DAG)."""
    if query.task_ids is None and query.task_group_id is None:
        return {query.dag_id: states.run_states.get(date, MISSING_STATE)}
    found = states.task_states.get(date, {})
    names = query.task_ids if query.task_ids is not None else sorted(states.known_task_ids)
    return {name: found.get(name, MISSING_STATE) for name in names}


def _missing(query: ExternalQuery, states: ExternalStates) -> Verdict | None:
    if not states.dag_exists:
        return Verdict(NOT_FOUND, f"the external DAG {query.dag_id!r} does not exist")
    if query.task_ids is not None:
        absent = [t for t in query.task_ids if t not in states.known_task_ids]
        if absent:
            return Verdict(NOT_FOUND, f"{_what(query, absent)} do(es) not exist")
    if query.task_group_id is not None and not states.known_task_ids:
        return Verdict(NOT_FOUND, f"{_what(query)} does not exist (it has no tasks)")
    return None


def judge(query: ExternalQuery, states: ExternalStates, rules: StateRules) -> Verdict | None:
    """Failed, skipped, success, not found, or None (wait): Airflow's order of checks."""
    if rules.check_existence and (missing := _missing(query, states)) is not None:
        return missing
    per_date = {date: _states_at(query, states, date) for date in query.logical_dates}
    failed, skipped = TaskState.FAILED.value, TaskState.SKIPPED.value
    for status, wanted in ((failed, rules.failed), (skipped, rules.skipped)):
        for date, found in per_date.items():
            hit = sorted(name for name, state in found.items() if state in wanted)
            if hit:
                state = found[hit[0]]
                subject = _what(query, hit if query.task_ids or query.task_group_id else None)
                return Verdict(
                    status,
                    f"{subject} at logical date {date.isoformat()} is {state!r} "
                    f"(in {status}_states {sorted(wanted)})",
                )
    done = all(
        found and all(state in rules.allowed for state in found.values())
        for found in per_date.values()
    )
    if not done:
        return None
    dates = ", ".join(date.isoformat() for date in query.logical_dates)
    return Verdict(
        TaskState.SUCCESS.value, f"{_what(query)} reached {sorted(rules.allowed)} at {dates}"
    )


def plain_utc(moment: datetime) -> datetime:
    """``moment`` as a plain ``datetime`` in UTC (not a pendulum one): stored and compared
    the same way as the database's values."""
    utc = moment.astimezone(UTC)
    return datetime(
        utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, UTC
    )


def _names(value: Sequence[str] | None) -> list[str] | None:
    return None if value is None else [str(item) for item in value]


class ExternalTaskTrigger(MetadataReadingTrigger):
    """Polls the states of another DAG's tasks / task group / run every ``poke_interval``
    seconds, in the triggerer; fires ``{"status": success|failed|skipped|not_found,
    "message": ...}`` once decided."""

    def __init__(
        self,
        *,
        external_dag_id: str,
        logical_dates: Sequence[datetime],
        external_task_ids: Sequence[str] | None = None,
        external_task_group_id: str | None = None,
        allowed_states: Sequence[str] = (TaskState.SUCCESS.value,),
        failed_states: Sequence[str] = (),
        skipped_states: Sequence[str] = (),
        poke_interval: float = 2.0,
        check_existence: bool = False,
    ) -> None:
        super().__init__()
        if not logical_dates or not all(
            isinstance(d, datetime) and d.utcoffset() is not None for d in logical_dates
        ):
            raise ValueError(
                f"ExternalTaskTrigger logical_dates must be timezone-aware datetimes, got "
                f"{list(logical_dates)!r}"
            )
        self.query = ExternalQuery(
            dag_id=external_dag_id,
            logical_dates=tuple(plain_utc(date) for date in logical_dates),
            task_ids=None if external_task_ids is None else tuple(external_task_ids),
            task_group_id=external_task_group_id,
        )
        self.rules = StateRules(
            allowed=frozenset(allowed_states),
            failed=frozenset(failed_states),
            skipped=frozenset(skipped_states),
            check_existence=bool(check_existence),
        )
        self.poke_interval = float(poke_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        query, rules = self.query, self.rules
        return (
            classpath_of(ExternalTaskTrigger),
            {
                "external_dag_id": query.dag_id,
                "logical_dates": list(query.logical_dates),
                "external_task_ids": _names(query.task_ids),
                "external_task_group_id": query.task_group_id,
                "allowed_states": sorted(rules.allowed),
                "failed_states": sorted(rules.failed),
                "skipped_states": sorted(rules.skipped),
                "poke_interval": self.poke_interval,
                "check_existence": rules.check_existence,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reader = self.metadata()
        while True:
            try:
                states = await reader.external_states(self.query)
            except Exception as exc:  # noqa: BLE001 - a database hiccup: poll again later
                logger.warning(
                    "Could not read the states of %s: %s; polling again in %.3g s",
                    _what(self.query),
                    exc,
                    self.poke_interval,
                    extra={"action": "external_task_read_failed"},
                )
            else:
                verdict = judge(self.query, states, self.rules)
                if verdict is not None:
                    yield TriggerEvent({"status": verdict.status, "message": verdict.message})
                    return
            await anyio.sleep(self.poke_interval)
