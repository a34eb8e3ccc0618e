"""``get_parsing_context()``: which DAG and task the current import of a DAG file is for
(Airflow's ``airflow.sdk.get_parsing_context``).

The DAG processor imports a file to learn every DAG it defines: ``dag_id`` and ``task_id``
are None. A task (or callback) process imports the file to run one task of one DAG: they
name that DAG and task, so a file that generates many DAGs can build only the one needed::

    current = get_parsing_context().dag_id
    for name in configs:
        if current is not None and current != f"load_{name}":
            continue  # this process runs another DAG: skip building this one
        build_dag(name)

The task process sets them around its import (``parsing_for``). ``_AIRFLOW_PARSING_CONTEXT_
DAG_ID`` / ``_TASK_ID`` in the environment (Airflow's) answer when no import set them.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator

DAG_ID_ENV: Final = "_AIRFLOW_PARSING_CONTEXT_DAG_ID"
TASK_ID_ENV: Final = "_AIRFLOW_PARSING_CONTEXT_TASK_ID"


class AirflowParsingContext(NamedTuple):
    """The DAG and task the current import is for (None: every DAG, as the DAG processor)."""

    dag_id: str | None
    task_id: str | None


_current: list[AirflowParsingContext] = []


@contextmanager
def parsing_for(dag_id: str | None, task_id: str | None = None) -> Iterator[None]:
    """Within the block, ``get_parsing_context()`` names ``dag_id`` / ``task_id``."""
    _current.append(AirflowParsingContext(dag_id, task_id))
    try:
        yield
    finally:
        _current.pop()


def get_parsing_context() -> AirflowParsingContext:
    """The DAG and task this import of the DAG file is for (both None at parse time)."""
    if _current:
        return _current[-1]
    return AirflowParsingContext(os.environ.get(DAG_ID_ENV), os.environ.get(TASK_ID_ENV))
