"""Dynamic task mapping: one copy of a task per item of an upstream result, then a sum.

``list_files`` returns a list; ``count_lines`` is mapped over it (``.partial(...)`` fixes the
arguments every copy shares, ``.expand(...)`` maps the others), so the scheduler makes one
copy per file (``map_index`` 0, 1, 2) once ``list_files`` is done; each copy gets its own
file. ``total`` receives the copies' results as one list, in ``map_index`` order. ``shout``
maps a BashOperator over a literal list: two copies, each with its own command.

Try it (with ``make run`` going):

    .venv/bin/sluice dags trigger example_mapping
    .venv/bin/sluice runs list example_mapping          # count_lines[0], [1], [2]
    .venv/bin/sluice tasks result example_mapping <RUN_ID> count_lines --map-index 1
    .venv/bin/sluice tasks result example_mapping <RUN_ID> total
    .venv/bin/sluice tasks logs example_mapping <RUN_ID> shout --map-index 0
"""

from __future__ import annotations

from datetime import datetime

from engine import BashOperator, dag, task


@dag(schedule=None, start_date=datetime(2026, 1, 1), tags=["example", "mapping"])
def example_mapping() -> None:
    @task
    def list_files() -> list[str]:
        return ["orders.csv", "customers.csv", "returns.csv"]

    @task
    def count_lines(name: str, lines_per_kb: int, map_index: int) -> int:
        print(f"copy {map_index} counts {name}")
        return len(name) * lines_per_kb

    @task
    def total(counts: list[int]) -> int:
        return sum(counts)

    total(count_lines.partial(lines_per_kb=10).expand(name=list_files()))
    BashOperator.partial(task_id="shout").expand(bash_command=["echo hello", "echo world"])


example_mapping()
