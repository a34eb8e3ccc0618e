"""The parse runner: a pre-imported process that forks the DAG processor's parsing children
(``python -P -m engine.dag_processing.parse_runner --control-fd N``).

A cold parse pays for a fresh interpreter and for importing the engine's authoring API
(~100 ms a file, most of a small file's parse). The DAG processor starts this process once
(``engine.warm.service.WarmRunner``, as the executor does its warm task runner): it imports
what every parse imports (``PRELOAD``: the parsing child with the authoring API, the
built-in triggers and sensors) and the installed packages the DAG files import, then forks
one *standby* per request, reparented to the DAG processor, in a session of its own (the
processor kills its process group at the timeout). The loop and its safety checks are
``engine.warm.runner``'s.

When its file comes, a standby runs ``engine.dag_processing.parsing.main`` exactly as a cold
``python -m engine.dag_processing.parsing`` start would (``run_parse``): the same arguments
(the folders, the moment to dump its stack, the file), the result on its standard output,
what the file prints on its standard error, the channel as ``--request-fd`` when the
processor answers the file's top-level ``Variable.get`` / ``Connection.get`` on it. Each
file is parsed in its own fresh copy of the runner, which never imported a DAG file: one
file cannot pollute another. Everything here is stdlib until ``PRELOAD``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

from engine.warm.runner import DAG_FILE_MODULES, prime_operator_arguments, serve_main

MODULE: Final = "engine.dag_processing.parse_runner"
#: What every parse imports: the parsing child (the authoring API, the parse-time store,
#: serialization) and what a DAG file imports (``engine.warm.runner.DAG_FILE_MODULES``).
PRELOAD: Final = (
    "engine.dag_processing.parsing",
    *DAG_FILE_MODULES,
)
#: Imported when installed: DAG files often build their dates with pendulum.
OPTIONAL_PRELOAD: Final = ("pendulum",)


def run_parse(request: dict[str, Any], channel_fd: int) -> int:
    """In the standby, once its file came: ``python -m engine.dag_processing.parsing``
    with ``request["argv"]`` (and ``--request-fd`` when ``request["serve"]``)."""
    from engine.dag_processing import parsing

    argv = [str(arg) for arg in request["argv"]]
    if request.get("serve"):
        argv = ["--request-fd", str(channel_fd), *argv]
    else:
        os.close(channel_fd)
    sys.argv = [parsing.__file__, *argv]
    return parsing.main(argv)


def prime() -> None:
    """Fill, before the forks, what each child would build afresh: the operators' accepted
    arguments and the parsing child's argument parser."""
    from engine.dag_processing import parsing

    prime_operator_arguments()
    parsing.prime()


def main(argv: list[str] | None = None) -> int:
    return serve_main(
        argv,
        prog=f"python -m {MODULE}",
        modules=PRELOAD,
        optional=OPTIONAL_PRELOAD,
        run_step=run_parse,
        prime=prime,
    )


if __name__ == "__main__":
    sys.exit(main())
