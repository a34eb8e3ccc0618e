"""Pre-imported processes that fork children: the executor's warm task runner and the DAG
processor's parse runner share this machinery.

Owns the forking process's loop (``runner``: stdlib until its preload, run as each user's
``python -m`` entry point), the processes it forks as their parent sees them
(``processes``: pipe streams, a standby waiting for its work, the forked process's handle,
this process as their subreaper) and the parent's service that keeps one runner alive and
forks from it (``service``). May import the leaf utilities only; the runtime parts
(``engine.executor``, ``engine.dag_processing``) build on it, never the other way round.

Import from the modules themselves: this package imports nothing, so that a runner
process starts without the rest.
"""

__all__ = ()
