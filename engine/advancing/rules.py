"""Pure scheduling decisions: which tasks become ready, which runs end, which DAGs run.

No database, no clock: the scheduler reads state, asks these functions, writes the answer.

Theory of operation (trigger rules, Airflow 3's semantics). A task waiting in ``none`` is
decided from the counts of its direct upstream tasks' *finished* states (``success``,
``skipped``, ``failed``, ``upstream_failed``); a task still ``scheduled``, ``queued``,
``running``, ``deferred`` or ``up_for_retry`` is not finished and counts for nothing yet.
Each rule answers in two steps, as Airflow's trigger rule dependency does: first, can the
rule no longer be met? Then the task ends at once as ``upstream_failed`` or ``skipped``
(which of the two is Airflow's choice per rule, in the table of ``_DECIDERS``); otherwise,
is it met? Then the task becomes ``scheduled``; otherwise it waits. A task without upstream
tasks runs whatever its rule, and ``always`` runs without waiting for anything. Decisions
propagate in one call: a task marked ``skipped`` or ``upstream_failed`` is an upstream state
for its own downstream tasks.

Setup and teardown tasks (Airflow's): a teardown has the rule ``all_done_setup_success``: it
waits for every upstream task to finish, then runs if one of its direct upstream *setup*
tasks succeeded (so it runs after failed work, to release what the setup made), is
``skipped`` when all of them were skipped and ``upstream_failed`` when none succeeded;
without an upstream setup it is ``all_done``.

Mapped task groups (Airflow's per-``map_index`` dependencies): copy ``i`` of a task in a
mapped task group is decided from copy ``i`` alone of the tasks of its group directly
upstream of it, and from every instance of its other upstream tasks; so a failed copy
fails the same index below it, the other copies go on, and a task after the group (a
"reduce") counts every copy. Such a task is expanded into waiting copies as soon as its
group upstream tasks are expanded, then each copy is decided on its own.

The run ends once every task finished, by Airflow's leaf rule: it fails when a leaf task (one
without downstream tasks) is ``failed`` or ``upstream_failed``, and succeeds otherwise (every
leaf succeeded or was skipped). So a failed task whose downstream task ran anyway (under
``all_done``, say) and succeeded does not fail the run. Teardowns do not count (unless
``on_failure_fail_dagrun``): the leaves are the *effective* leaves, the tasks whose
downstream tasks are all such teardowns, so a failed teardown leaves the run's state to its
work, and a failed work task still fails the run when its teardown succeeded. With Airflow's
rules every task is decided once its upstream tasks finished, so a run always ends; a rule
this version does not know (parsing refuses one) would leave its task waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from engine.authoring.arguments import TriggerRule

# Whether an asset condition is met lives with the conditions (``engine.authoring.assets``)
# so that ``sluice dags why`` (``engine.views.why``) asks the very function the
# scheduler asks; re-exported here with the scheduler's other decisions.
from engine.authoring.assets import is_condition_met as is_condition_met
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from collections.abc import Set as AbstractSet

FINISHED: Final = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED, TaskState.UPSTREAM_FAILED}
)
_FAILED: Final = frozenset({TaskState.FAILED, TaskState.UPSTREAM_FAILED})
_NO_EDGES: Final[Mapping[str, Sequence[str]]] = MappingProxyType({})
_NO_RULES: Final[Mapping[str, str]] = MappingProxyType({})
_ALL_SUCCESS: Final = TriggerRule.ALL_SUCCESS
_NO_PAIRS: Final[Mapping[str, AbstractSet[str]]] = MappingProxyType({})

_RUN: Final = TaskState.SCHEDULED
_SKIP: Final = TaskState.SKIPPED
_UPSTREAM_FAILED: Final = TaskState.UPSTREAM_FAILED


@dataclass(frozen=True, slots=True)
class UpstreamCounts:
    """How many of a task's direct upstream tasks ended in each finished state."""

    total: int
    success: int = 0
    skipped: int = 0
    failed: int = 0
    upstream_failed: int = 0
    #: the direct upstream tasks that are setup tasks, and how many succeeded / skipped
    setup_total: int = 0
    setup_success: int = 0
    setup_skipped: int = 0

    @classmethod
    def of(cls, states: Iterable[str], setup_states: Iterable[str] = ()) -> UpstreamCounts:
        listed, setups = list(states), list(setup_states)
        return cls(
            total=len(listed),
            success=listed.count(TaskState.SUCCESS),
            skipped=listed.count(TaskState.SKIPPED),
            failed=listed.count(TaskState.FAILED),
            upstream_failed=listed.count(TaskState.UPSTREAM_FAILED),
            setup_total=len(setups),
            setup_success=setups.count(TaskState.SUCCESS),
            setup_skipped=setups.count(TaskState.SKIPPED),
        )

    @property
    def done(self) -> int:
        return self.success + self.skipped + self.failed + self.upstream_failed

    @property
    def all_done(self) -> bool:
        return self.done >= self.total

    @property
    def any_failed(self) -> bool:
        """A ``failed`` or ``upstream_failed`` upstream task."""
        return bool(self.failed or self.upstream_failed)


# --- the rules: ``scheduled``, ``skipped``, ``upstream_failed``, or None (wait) ------------


def _all_success(c: UpstreamCounts) -> TaskState | None:
    if c.any_failed:
        return _UPSTREAM_FAILED
    if c.skipped:
        return _SKIP
    return _RUN if c.success == c.total else None


def _all_failed(c: UpstreamCounts) -> TaskState | None:
    if c.success or c.skipped:
        return _SKIP
    return _RUN if c.failed + c.upstream_failed == c.total else None


def _all_done(c: UpstreamCounts) -> TaskState | None:
    return _RUN if c.all_done else None


def _all_done_setup_success(c: UpstreamCounts) -> TaskState | None:
    # A teardown's rule: all_done, unless it has direct upstream setups and none succeeded.
    if not c.all_done:
        return None
    if c.setup_total and c.setup_skipped >= c.setup_total:
        return _SKIP
    if c.setup_total and not c.setup_success:
        return _UPSTREAM_FAILED
    return _RUN


def _all_skipped(c: UpstreamCounts) -> TaskState | None:
    if c.success or c.any_failed:
        return _SKIP
    return _RUN if c.skipped == c.total else None


def _all_done_min_one_success(c: UpstreamCounts) -> TaskState | None:
    # Airflow counts a skipped upstream task as "not done" for this rule: it skips at once.
    if c.skipped:
        return _SKIP
    if not c.all_done:
        return None
    return _RUN if c.success else _UPSTREAM_FAILED


def _one_success(c: UpstreamCounts) -> TaskState | None:
    if c.success:
        return _RUN
    if not c.all_done:
        return None
    return _SKIP if c.skipped == c.total else _UPSTREAM_FAILED


def _one_failed(c: UpstreamCounts) -> TaskState | None:
    if c.any_failed:
        return _RUN
    return _SKIP if c.all_done else None


def _one_done(c: UpstreamCounts) -> TaskState | None:
    # "Done" is success or failed: skipped and upstream_failed upstream tasks do not count.
    if c.success or c.failed:
        return _RUN
    return _SKIP if c.all_done else None


def _none_failed(c: UpstreamCounts) -> TaskState | None:
    if c.any_failed:
        return _UPSTREAM_FAILED
    return _RUN if c.success + c.skipped == c.total else None


def _none_failed_min_one_success(c: UpstreamCounts) -> TaskState | None:
    if c.any_failed:
        return _UPSTREAM_FAILED
    if c.skipped == c.total:
        return _SKIP
    return _RUN if c.success + c.skipped == c.total else None


def _none_skipped(c: UpstreamCounts) -> TaskState | None:
    if c.skipped:
        return _SKIP
    return _RUN if c.all_done else None


def _always(c: UpstreamCounts) -> TaskState | None:
    return _RUN


_DECIDERS: Final[Mapping[str, Callable[[UpstreamCounts], TaskState | None]]] = MappingProxyType(
    {
        TriggerRule.ALL_SUCCESS: _all_success,
        TriggerRule.ALL_FAILED: _all_failed,
        TriggerRule.ALL_DONE: _all_done,
        TriggerRule.ALL_DONE_SETUP_SUCCESS: _all_done_setup_success,
        TriggerRule.ALL_DONE_MIN_ONE_SUCCESS: _all_done_min_one_success,
        TriggerRule.ALL_SKIPPED: _all_skipped,
        TriggerRule.ONE_SUCCESS: _one_success,
        TriggerRule.ONE_FAILED: _one_failed,
        TriggerRule.ONE_DONE: _one_done,
        TriggerRule.NONE_FAILED: _none_failed,
        TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS: _none_failed_min_one_success,
        TriggerRule.NONE_SKIPPED: _none_skipped,
        TriggerRule.ALWAYS: _always,
    }
)
#: The trigger rules the scheduler decides (every ``TriggerRule``; a test keeps them equal).
DECIDED_RULES: Final = frozenset(_DECIDERS)


def decide(rule: str, counts: UpstreamCounts) -> TaskState | None:
    """The new state of a task in ``none`` under ``rule`` given its upstream ``counts``:
    ``scheduled``, ``skipped``, ``upstream_failed``, or None (it waits)."""
    if counts.total == 0:
        return _RUN  # no upstream task: nothing to wait for, whatever the rule
    decider = _DECIDERS.get(rule)
    return None if decider is None else decider(counts)


def upstream_of(downstream: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Invert ``task -> downstream tasks`` into ``task -> upstream tasks``."""
    upstream: dict[str, list[str]] = {task: [] for task in downstream}
    for task, children in downstream.items():
        for child in children:
            upstream.setdefault(child, []).append(task)
    return upstream


def next_task_states(
    downstream: Mapping[str, Sequence[str]],
    states: Mapping[str, str],
    trigger_rules: Mapping[str, str] = _NO_RULES,
    expanded: Mapping[str, Sequence[str]] = _NO_EDGES,
    setups: AbstractSet[str] = frozenset(),
) -> dict[str, str]:
    """New states of tasks still in ``none``, each decided by its trigger rule
    (``next_states`` without mapped task groups: the tasks' changes only)."""
    return next_states(downstream, states, trigger_rules, expanded, setups).tasks


@dataclass(frozen=True, slots=True)
class Decisions:
    """What ``next_states`` decided: new states of whole tasks (``tasks``), of single copies
    of mapped group tasks (``copies``: task id -> {map_index: state}), and the group tasks
    to expand into waiting copies, decided copy by copy from then on (``to_expand``)."""

    tasks: dict[str, str]
    copies: dict[str, dict[int, str]]
    to_expand: frozenset[str]


def next_states(
    downstream: Mapping[str, Sequence[str]],
    states: Mapping[str, str],
    trigger_rules: Mapping[str, str] = _NO_RULES,
    expanded: Mapping[str, Sequence[str]] = _NO_EDGES,
    setups: AbstractSet[str] = frozenset(),
    paired: Mapping[str, AbstractSet[str]] = _NO_PAIRS,
) -> Decisions:
    """New states of tasks (or copies) still in ``none``, each decided by its trigger rule.

    ``trigger_rules`` maps task ids to rules; a task missing from it has ``all_success``.
    ``expanded`` maps an expanded mapped task to the states of its copies: each copy counts
    as one upstream task instance of the tasks below it (as in Airflow, where a mapped
    upstream task's every map index counts). ``setups`` are the setup tasks, whose states a
    teardown's ``all_done_setup_success`` also counts apart. Decisions propagate transitively
    in one call (a skip or an upstream failure reaches the tasks below it at once).

    ``paired`` maps a task of a mapped task group to the other tasks of its group: once
    those directly upstream of it are expanded, its copy ``i`` counts only their copy ``i``
    (and every instance of its other upstream tasks), as Airflow decides per ``map_index``;
    the task is first expanded into waiting copies (``Decisions.to_expand``).
    """
    upstream = upstream_of(downstream)
    current = dict(states)
    copies = {task: list(states_) for task, states_ in expanded.items()}
    changes: dict[str, str] = {}
    copy_changes: dict[str, dict[int, str]] = {}
    to_expand: set[str] = set()

    def instances(task: str) -> Sequence[str]:
        found = copies.get(task)
        return found if found is not None else (current.get(task, TaskState.NONE),)

    changed = True
    while changed:
        changed = False
        for task, state in current.items():
            ups = upstream.get(task, [])
            pairs = paired.get(task, frozenset()) & set(ups)
            if pairs and all(up in copies for up in pairs):
                if task in copies:
                    found = _copy_states(task, ups, pairs, copies, instances, setups)
                    new_copies = {
                        index: new
                        for index, counts in found.items()
                        if (new := decide(trigger_rules.get(task, _ALL_SUCCESS), counts))
                        is not None
                    }
                    for index, new in new_copies.items():
                        copies[task][index] = copy_changes.setdefault(task, {})[index] = new
                    current[task] = _summary_or_none(copies[task])
                    changed = changed or bool(new_copies)
                elif state == TaskState.NONE:
                    to_expand.add(task)
                continue
            if state != TaskState.NONE:
                continue
            counts = UpstreamCounts.of(
                (s for up in ups for s in instances(up)),
                (s for up in ups if up in setups for s in instances(up)),
            )
            new = decide(trigger_rules.get(task, TriggerRule.ALL_SUCCESS), counts)
            if new is not None:
                current[task] = changes[task] = new
                changed = True
    return Decisions(changes, copy_changes, frozenset(to_expand))


def _copy_states(
    task: str,
    ups: Sequence[str],
    pairs: AbstractSet[str],
    copies: Mapping[str, Sequence[str]],
    instances: Callable[[str], Sequence[str]],
    setups: AbstractSet[str],
) -> dict[int, UpstreamCounts]:
    """The upstream counts of each waiting copy of ``task``: copy ``i`` of its ``pairs``
    (its mapped group's tasks), every instance of its other upstream tasks."""
    out: dict[int, UpstreamCounts] = {}
    for index, copy_state in enumerate(copies[task]):
        if copy_state != TaskState.NONE:
            continue

        def of(up: str, index: int = index) -> Sequence[str]:
            theirs = copies[up] if up in pairs else ()
            return (theirs[index],) if index < len(theirs) else instances(up)

        out[index] = UpstreamCounts.of(
            (s for up in ups for s in of(up)), (s for up in ups if up in setups for s in of(up))
        )
    return out


def _summary_or_none(copies: Sequence[str]) -> str:
    """A mapped task's state for the rules: ``none`` while one of its copies waits."""
    return TaskState.NONE if TaskState.NONE in copies else summary_state(copies)


def summary_state(copies: Sequence[str]) -> str:
    """One state for the copies of a mapped task (the run's leaf rule and its listings):
    ``none`` while all wait (to be expanded again), ``running`` while one is unfinished;
    then ``failed`` if one failed, ``upstream_failed`` if one was, ``success`` if one
    succeeded, else ``skipped``."""
    if all(state == TaskState.NONE for state in copies):
        return TaskState.NONE  # none yet, or a run that starts over: expanded again
    if not all(state in FINISHED for state in copies):
        return TaskState.RUNNING
    for state in (TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.SUCCESS):
        if state in copies:
            return state
    return TaskState.SKIPPED


def effective_leaves(
    tasks: Iterable[str],
    downstream: Mapping[str, Sequence[str]],
    ignored: AbstractSet[str] = frozenset(),
) -> list[str]:
    """The tasks whose state decides a run (Airflow's effective leaves): those not in
    ``ignored`` (the teardowns without ``on_failure_fail_dagrun``) whose downstream tasks
    are all in ``ignored``; the plain leaves when no task is one (a DAG of teardowns only)."""
    listed = list(tasks)
    leaves = [
        task
        for task in listed
        if task not in ignored and all(d in ignored for d in downstream.get(task, ()))
    ]
    return leaves or [task for task in listed if not downstream.get(task)]


def run_outcome(
    states: Mapping[str, str],
    downstream: Mapping[str, Sequence[str]] = _NO_EDGES,
    ignored_teardowns: AbstractSet[str] = frozenset(),
) -> str | None:
    """The final state of a DAG run by Airflow's leaf rule; None while it goes on.

    Once every task finished: ``failed`` if an effective leaf task (``effective_leaves``: no
    downstream task in ``downstream`` but ``ignored_teardowns``; without ``downstream``
    every task is a leaf) is ``failed`` or ``upstream_failed``, else ``success`` (every
    effective leaf succeeded or was skipped).
    """
    if not states or not all(state in FINISHED for state in states.values()):
        return None
    leaves = effective_leaves(states, downstream, ignored_teardowns)
    failed = any(states[task] in _FAILED for task in leaves)
    return DagRunState.FAILED if failed else DagRunState.SUCCESS
