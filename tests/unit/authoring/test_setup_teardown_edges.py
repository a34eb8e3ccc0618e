"""Setup and teardown tasks (marks, decorators, ``with`` blocks, the scheduler's rule and the
run's state), ``Label`` on edges and ``chain_linear``: as a DAG file defines them and as the
scheduler's pure rules decide them."""

from __future__ import annotations

import pytest

from engine import (
    DAG,
    EdgeModifier,
    EmptyOperator,
    Label,
    TaskGroup,
    TriggerRule,
    chain_linear,
    setup,
    task,
    teardown,
)
from engine.advancing.rules import effective_leaves, next_task_states, run_outcome
from engine.authoring.errors import DagDefinitionError
from engine.states import TaskState

OK, FAILED, SKIPPED = TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED
UPSTREAM_FAILED, NONE, RUN = TaskState.UPSTREAM_FAILED, TaskState.NONE, TaskState.SCHEDULED


def _edges(dag: DAG) -> dict[str, set[str]]:
    return {tid: set(t.downstream_task_ids) for tid, t in dag.task_dict.items()}


# --- marks and decorators --------------------------------------------------------------------


def test_as_teardown_marks_both_tasks_links_the_setup_and_sets_the_rule() -> None:
    with DAG("d") as dag:
        create, work, delete = (EmptyOperator(task_id=t) for t in ("create", "work", "delete"))
        create >> work >> delete.as_teardown(setups=create)
    assert create.is_setup and not create.is_teardown
    assert delete.is_teardown and not delete.on_failure_fail_dagrun
    assert delete.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert _edges(dag) == {"create": {"work", "delete"}, "work": {"delete"}, "delete": set()}


def test_decorators_mark_every_task_their_calls_add() -> None:
    @setup
    def create_cluster() -> str:
        return "c"

    @teardown(on_failure_fail_dagrun=True)
    def delete_cluster(cluster: str) -> None: ...

    @task
    def work(cluster: str) -> None: ...

    with DAG("d") as dag:
        cluster = create_cluster()
        work(cluster) >> delete_cluster(cluster)
        again = create_cluster.override(task_id="again")()
    assert cluster.is_setup and again.is_setup and again.task_id == "again"
    delete = dag.get_task("delete_cluster")
    assert delete.is_teardown and delete.on_failure_fail_dagrun
    assert delete.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert delete.upstream_task_ids == {"create_cluster", "work"}


def test_a_decorated_task_flavour_and_a_mapped_call_are_marked_too() -> None:
    def say_hi() -> str:
        return "echo hi"

    def release(x: int) -> int:
        return x

    marked = setup(task.bash(say_hi))
    cleanup = teardown(task(release))
    with DAG("d"):
        bash = marked()
        mapped = cleanup.expand(x=[1, 2])
    assert bash.is_setup and type(bash).__name__ == "BashTaskOperator"
    assert mapped.is_teardown and type(mapped).__name__ == "MappedOperator"


def test_a_task_cannot_be_both_a_setup_and_a_teardown() -> None:
    with DAG("d"):
        both = EmptyOperator(task_id="both").as_setup()
        with pytest.raises(DagDefinitionError, match="is a setup task; it cannot also be"):
            both.as_teardown()


def test_a_with_block_puts_its_tasks_between_the_setups_and_the_teardown() -> None:
    @setup
    def outer_setup() -> str:
        return "x"

    @teardown
    def outer_teardown(x: str) -> None: ...

    @task
    def outer_work() -> None: ...

    with DAG("d") as dag:
        with outer_teardown(outer_setup()):
            outer_work()
            with TaskGroup("section"):
                first = EmptyOperator(task_id="first")
                first >> EmptyOperator(task_id="second")
    assert _edges(dag) == {
        "outer_setup": {"outer_teardown", "outer_work", "section.first"},
        "outer_teardown": set(),
        "outer_work": {"outer_teardown"},
        "section.first": {"section.second"},
        "section.second": {"outer_teardown"},
    }


def test_only_setup_and_teardown_tasks_open_a_with_block() -> None:
    with DAG("d"):
        plain = EmptyOperator(task_id="plain")
        with pytest.raises(DagDefinitionError, match="only setup and teardown tasks open"):
            with plain:
                pass


def test_a_group_ending_in_a_teardown_links_onward_from_its_work() -> None:
    with DAG("d") as dag:
        with TaskGroup("section") as section:
            made = EmptyOperator(task_id="setup").as_setup()
            work = EmptyOperator(task_id="work")
            gone = EmptyOperator(task_id="teardown")
            made >> work >> gone.as_teardown(setups=made)
        section >> EmptyOperator(task_id="next")
    assert [t.task_id for t in section.leaves] == ["section.work"]
    assert _edges(dag)["section.work"] == {"section.teardown", "next"}
    assert _edges(dag)["section.teardown"] == set()


# --- the scheduler's rule and the run's state --------------------------------------------------


SETUP_WORK_TEARDOWN = {"s": ["w", "t"], "w": ["t"], "t": []}
RULES = {"t": TriggerRule.ALL_DONE_SETUP_SUCCESS}


@pytest.mark.parametrize(
    ("setup_state", "work_state", "teardown_becomes"),
    [
        (OK, FAILED, RUN),  # the work failed: the teardown releases what the setup made
        (OK, UPSTREAM_FAILED, RUN),
        (OK, OK, RUN),
        (FAILED, UPSTREAM_FAILED, UPSTREAM_FAILED),  # nothing was set up
        (SKIPPED, SKIPPED, SKIPPED),
        (OK, TaskState.RUNNING, None),  # waits for the work
    ],
)
def test_a_teardown_runs_once_its_setup_succeeded_and_its_work_finished(
    setup_state: str, work_state: str, teardown_becomes: str | None
) -> None:
    states = {"s": setup_state, "w": work_state, "t": NONE}
    changes = next_task_states(SETUP_WORK_TEARDOWN, states, RULES, setups=frozenset({"s"}))
    assert changes.get("t") == teardown_becomes


def test_without_an_upstream_setup_the_teardown_rule_is_all_done() -> None:
    changes = next_task_states({"w": ["t"], "t": []}, {"w": FAILED, "t": NONE}, RULES)
    assert changes == {"t": RUN}


@pytest.mark.parametrize(
    ("work", "teardown", "ignored", "outcome"),
    [
        (OK, FAILED, {"t"}, "success"),  # a teardown's failure does not fail the run ...
        (OK, FAILED, set(), "failed"),  # ... unless on_failure_fail_dagrun
        (FAILED, OK, {"t"}, "failed"),  # the work is the effective leaf
        (OK, OK, {"t"}, "success"),
    ],
)
def test_the_run_state_ignores_teardowns_unless_they_fail_the_run(
    work: str, teardown: str, ignored: set[str], outcome: str
) -> None:
    states = {"s": OK, "w": work, "t": teardown}
    assert run_outcome(states, SETUP_WORK_TEARDOWN, frozenset(ignored)) == outcome


def test_effective_leaves_fall_back_to_the_leaves_of_a_dag_of_teardowns() -> None:
    assert effective_leaves(["a", "t"], {"a": ["t"], "t": []}, {"t"}) == ["a"]
    assert effective_leaves(["t"], {"t": []}, {"t"}) == ["t"]


# --- labels and chain_linear ---------------------------------------------------------------------


def test_a_label_links_and_names_each_edge_it_sits_on() -> None:
    with DAG("d") as dag:
        check, load, alert, audit = (
            EmptyOperator(task_id=t) for t in ("check", "load", "alert", "audit")
        )
        check >> Label("valid") >> load
        check >> Label("invalid") >> [alert, audit]
        [alert, audit] << Label("back") << load  # the other direction, lists on either side
    assert _edges(dag)["check"] == {"load", "alert", "audit"}
    assert dag.get_edge_info("check", "load") == {"label": "valid"}
    assert dag.edge_labels_of("check") == {"alert": "invalid", "audit": "invalid", "load": "valid"}
    assert dag.edge_labels_of("load") == {"alert": "back", "audit": "back"}
    assert dag.get_edge_info("load", "check") == {}


def test_a_label_between_task_groups_names_the_edges_of_their_leaves_and_roots() -> None:
    with DAG("d") as dag:
        with TaskGroup("a") as a:
            EmptyOperator(task_id="x")
        with TaskGroup("b") as b:
            EmptyOperator(task_id="y") >> EmptyOperator(task_id="z")
        a >> EdgeModifier("groups") >> b
    assert dag.edge_labels_of("a.x") == {"b.y": "groups"}


def test_a_label_takes_only_text_and_two_labels_do_not_chain() -> None:
    with pytest.raises(DagDefinitionError, match="a label must be a str"):
        Label(3)  # type: ignore[arg-type]
    with DAG("d"):
        with pytest.raises(DagDefinitionError, match="two labels cannot follow each other"):
            EmptyOperator(task_id="a") >> Label("x") >> Label("y")


def test_chain_linear_links_every_task_of_an_element_to_every_task_of_the_next() -> None:
    with DAG("d") as dag:
        t = {n: EmptyOperator(task_id=n) for n in ("t1", "t2", "t3", "t4", "t5", "t6")}
        chain_linear(t["t1"], [t["t2"], t["t3"]], [t["t4"], t["t5"]], t["t6"])
    assert _edges(dag) == {
        "t1": {"t2", "t3"},
        "t2": {"t4", "t5"},
        "t3": {"t4", "t5"},
        "t4": {"t6"},
        "t5": {"t6"},
        "t6": set(),
    }


def test_chain_linear_refuses_labels_and_a_single_element() -> None:
    with DAG("d"):
        a, b = EmptyOperator(task_id="a"), EmptyOperator(task_id="b")
        with pytest.raises(DagDefinitionError, match="does not take labels"):
            chain_linear(a, Label("x"), b)
        with pytest.raises(DagDefinitionError, match="set no dependency"):
            chain_linear([a, b])
