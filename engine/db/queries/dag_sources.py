"""What the code view reads of a DAG: its file's last good source as stored (encrypted) and
its ``doc_md``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from engine.db.models import Dag, DagFile

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class DagSourceRow:
    """A DAG's file and docs; ``token`` is the encrypted source of the file's last good
    parse (None: not kept, or the file has no good parse stored)."""

    dag_id: str
    fileloc: str
    description: str | None
    doc_md: str | None
    token: str | None
    parsed_at: datetime | None


def dag_source(session: Session, dag_id: str) -> DagSourceRow | None:
    """The DAG's file, docs and stored source; None if the DAG is unknown."""
    row = session.execute(
        select(Dag.fileloc, Dag.description, Dag.doc_md, DagFile.source, DagFile.parsed_at)
        .outerjoin(DagFile, DagFile.fileloc == Dag.fileloc)
        .where(Dag.dag_id == dag_id)
    ).first()
    if row is None:
        return None
    fileloc, description, doc_md, token, parsed_at = row
    return DagSourceRow(dag_id, str(fileloc), description, doc_md, token, parsed_at)
