"""An operator of the user's own works whatever the DAG file imported before: each check
runs in a fresh interpreter that imports only ``from engine import DAG, BaseOperator``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

OWN_OPERATOR = """
from engine import DAG, BaseOperator

class Add(BaseOperator):
    template_fields = ("x",)

    def __init__(self, *, x, **kwargs):
        super().__init__(**kwargs)
        self.x = x

    def execute(self, context):
        return self.x + 1
"""


def _run(body: str) -> list[str]:
    """What the script prints, one word per item (fails with its stderr if it fails)."""
    script = OWN_OPERATOR + textwrap.dedent(body)
    out = subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_partial_works_with_nothing_else_imported() -> None:
    printed = _run(
        """
        with DAG("d", schedule=None) as dag:
            Add.partial(task_id="add").expand(x=[1, 2])
        print(type(dag.task_dict["add"]).__name__)
        """
    )
    assert printed == ["MappedOperator"]


def test_a_result_in_a_template_field_links_with_nothing_else_imported() -> None:
    printed = _run(
        """
        with DAG("d", schedule=None) as dag:
            first = Add(task_id="first", x=1)
            Add(task_id="second", x=first.output)
        print(*sorted(dag.task_dict["second"].upstream_task_ids))
        """
    )
    assert printed == ["first"]
