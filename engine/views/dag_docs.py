"""What a DAG says of itself, as the code view and the trigger form show it: its file's
source as last parsed well (decrypted), its ``doc_md`` and description, and its params'
stored specs (``engine.authoring.params.param_spec``) with the DAG's id checked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from engine.db.queries import dag_sources
from engine.db.queries import dags as dags_sql
from engine.exceptions import DecryptionError
from engine.views.common import iso

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher


class DagCodeShown(TypedDict):
    dag_id: str
    fileloc: str
    description: str | None
    doc_md: str | None
    source: str | None  # None: see ``source_problem``
    source_problem: str | None  # why there is no source to show
    parsed_at: str | None  # when the source shown parsed


def dag_code(session: Session, dag_id: str, *, cipher: KwargsCipher) -> DagCodeShown | None:
    """The DAG's file source as the DAG processor last parsed it well, with its docs; None
    if the DAG is unknown. The source is what the tasks run, not the file on disk now."""
    row = dag_sources.dag_source(session, dag_id)
    if row is None:
        return None
    source, problem = None, None
    if row.token is None:
        problem = (
            f"no source of {row.fileloc} is stored: the DAG processor keeps it from its "
            "next good parse of the file"
        )
    else:
        try:
            source = cipher.decrypt(row.token)
        except DecryptionError as exc:
            problem = f"the stored source of {row.fileloc} cannot be read: {exc}"
    return {
        "dag_id": dag_id,
        "fileloc": row.fileloc,
        "description": row.description,
        "doc_md": row.doc_md,
        "source": source,
        "source_problem": problem,
        "parsed_at": iso(row.parsed_at),
    }


class TriggerParams(TypedDict):
    dag_id: str
    params: dict[str, Any]  # name -> stored spec, in the DAG's order


def trigger_params(session: Session, dag_id: str) -> TriggerParams | None:
    """The DAG's params (stored specs) for a trigger form; None if the DAG is unknown."""
    if not dags_sql.dag_exists(session, dag_id):
        return None
    return {"dag_id": dag_id, "params": dags_sql.dag_param_specs(session, dag_id) or {}}
