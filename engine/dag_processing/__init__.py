"""The DAG processor: DAG files parsed in child processes, their results synced to the DB.

Owns the parse loop (``processor``), the child that imports one file (``parsing``) and the
diff of parse results against the database (``sync``). May import: ``engine.db``,
``engine.authoring`` and the leaf utilities; never another runtime part.
"""

from __future__ import annotations

from engine.dag_processing.processor import DagProcessor, DagProcessorSettings

__all__: tuple[str, ...] = ("DagProcessor", "DagProcessorSettings")
