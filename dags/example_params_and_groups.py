"""Params of every kind, a task group and labelled edges: what the web UI's trigger form,
graph, code and results pages show.

The DAG's ``Param``s make the trigger form (``/dags/example_params_and_groups/trigger``):
a text field (``region``), a whole number (``batch_size``, at least 1), a number
(``sample_rate``, 0..1), a checkbox (``dry_run``), a select (``mode``, an enum), and JSON
fields (``tables``, an array; ``options``, an object). ``load`` is a task group of two
tasks (``load.stage``, ``load.publish``): the graph page folds it into one node on request.
``check`` branches, and the edges out of it carry ``Label``s.

Try it (with ``make run`` going), in the UI or:

    .venv/bin/sluice dags trigger example_params_and_groups --conf '{"batch_size": 50}'
    .venv/bin/sluice tasks result example_params_and_groups <RUN_ID> plan
"""

from __future__ import annotations

from datetime import datetime

from engine import Label, Param, TaskGroup, dag, task

DOC = """\
# Params and groups

Triggered by hand. `plan` reads the params, `check` picks the full load or a
dry run, and the `load` group stages then publishes.
"""


@dag(
    schedule=None,
    start_date=datetime(2026, 1, 1),
    doc_md=DOC,
    params={
        "region": Param("eu", type="string", description="Where the data comes from."),
        "batch_size": Param(100, type="integer", minimum=1, description="Rows per batch."),
        "sample_rate": Param(0.5, type="number", minimum=0, maximum=1),
        "dry_run": Param(False, type="boolean", description="Plan only; load nothing."),
        "mode": Param("append", enum=["append", "replace"], description="How to load."),
        "tables": Param(["orders"], type="array", description="The tables to load."),
        "options": Param({}, type="object", description="Extra loader options."),
    },
    tags=["example", "ui"],
)
def example_params_and_groups() -> None:
    @task
    def plan(params: dict) -> dict[str, object]:  # type: ignore[type-arg]
        return {"region": params["region"], "batches": len(params["tables"]), **params}

    @task.branch
    def check(params: dict) -> str:  # type: ignore[type-arg]
        return "skip_load" if params["dry_run"] else "load.stage"

    @task
    def skip_load() -> str:
        return "dry run: nothing loaded"

    with TaskGroup("load") as load:

        @task
        def stage(params: dict) -> int:  # type: ignore[type-arg]
            return int(params["batch_size"])

        @task
        def publish() -> str:
            return "published"

        stage() >> publish()

    decided = check()
    plan() >> decided
    decided >> Label("load the data") >> load
    decided >> Label("dry run") >> skip_load()


example_params_and_groups()
