"""The rows of a DAG's runs grid: one per task in the DAG's order, one per copy of a mapped
task (``task[0]``, ``task[1]``, ... as the run lists them), then any task a run still has
that the DAG lost. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

_COPY: Final = re.compile(r"^(?P<task>.+)\[(?P<index>\d+)\]$")


@dataclass(frozen=True, slots=True)
class GridRow:
    """``name`` as the runs' ``tasks`` dicts key it; the task and copy it stands for."""

    name: str
    task_id: str
    map_index: int = -1


def grid_rows(task_ids: Sequence[str], runs: Iterable[Mapping[str, Any]]) -> list[GridRow]:
    """The rows for ``runs`` (each with ``tasks``: {name: state}) of a DAG with ``task_ids``."""
    known = set(task_ids)
    copies: dict[str, set[int]] = {}
    others: dict[str, None] = {}
    for run in runs:
        for name in run.get("tasks") or {}:
            match = _COPY.match(name)
            if name in known:
                continue
            if match and match["task"] in known:
                copies.setdefault(match["task"], set()).add(int(match["index"]))
            else:
                others[name] = None
    rows: list[GridRow] = []
    for task_id in task_ids:
        if task_id in copies:
            rows += [GridRow(f"{task_id}[{i}]", task_id, i) for i in sorted(copies[task_id])]
        else:
            rows.append(GridRow(task_id, task_id))
    for name in others:
        match = _COPY.match(name)
        rows.append(
            GridRow(name, match["task"], int(match["index"])) if match else GridRow(name, name)
        )
    return rows
