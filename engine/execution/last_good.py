"""A task whose DAG file is broken now runs the file's last good version (the child's side).

Theory of operation. The DAG processor keeps, for each DAG file, the source that gave its
last good parse (``dag_file.source``, encrypted; ``engine.dag_processing.sync``). A task's
process (or a callback's) imports the file on disk as usual; when that fails, it asks its
executor over the request channel for the stored source, which the executor gives only
while the DAG processor has a *parse error* recorded for the file (``dag_parse_error``):
the file itself is broken. When that source differs from what is on disk, the task runs it
instead, after one warning in the task log naming the file, the error, the recorded parse
error and when that version was parsed. So a run started before the file broke completes
with the code it was started with, while the DAG processor reports the broken file
(``sluice dags errors``); the next task that starts after a fix runs the fixed file.
(Airflow 3 pins each run to a DAG version when its bundle is versioned; for a plain folder
of files this is the equivalent that matters: a typo saved mid-run does not fail the run.)

No fallback, the task failing with its own error: without a channel (a test running a
spec by hand), without a recorded parse error (a module missing on this worker, an
environment error at import, a timeout, or an edit the DAG processor has not parsed yet:
the file may be fine, and running an older version of it silently would be wrong), without
a stored version (a file never parsed well), or when the stored version is what is on disk
(the file fails for another reason, e.g. a module it imports broke).
Stdlib only, besides the DAG file import: the task process stays light.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from engine.authoring.dag_files import decode_source
from engine.execution.task_channel import ChannelError

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.execution.task_channel import TaskChannel

__all__ = ("LastGood", "load_or_last_good", "use_channel")

logger = logging.getLogger(__name__)

T = TypeVar("T")

_channel: TaskChannel | None = None


def use_channel(channel: TaskChannel | None) -> None:
    """The request channel to ask the executor on (set once by the child at start)."""
    global _channel
    _channel = channel


@dataclass(frozen=True, slots=True)
class LastGood:
    """The stored last good version of a DAG file."""

    fileloc: str
    source: str
    parsed_at: str  # ISO 8601, UTC
    parse_error: str  # what the DAG processor recorded about the file as it is now


def load_or_last_good(fileloc: str, load: Callable[[str | None], T]) -> T:
    """``load(None)`` (the file on disk); when it fails, ``load(source)`` of the file's
    last good version if the DAG processor recorded a parse error for the file and the
    stored version differs from the disk's.

    Raises what ``load(None)`` raised when there is no such version, or when it fails too.
    """
    try:
        return load(None)
    except (Exception, SystemExit) as exc:  # the DAG file's own failure: re-raised below
        stored = fetch_last_good(fileloc)
        if stored is None or stored.source == _disk_text(fileloc):
            raise
        logger.warning(
            "DAG file %s cannot be used now (%s; the DAG processor reports: %s); running the "
            "last good version of it, parsed at %s (fix the file: `sluice dags errors` shows "
            "the error)",
            fileloc,
            _summary(exc),
            stored.parse_error,
            stored.parsed_at,
            extra={"action": "last_good_dag_file", "fileloc": fileloc},
        )
        try:
            return load(stored.source)
        except (Exception, SystemExit) as again:  # noqa: BLE001 - fails too: the first error stands
            logger.warning(
                "The last good version of %s fails too: %s",
                fileloc,
                _summary(again),
                extra={"action": "last_good_dag_file_failed", "fileloc": fileloc},
            )
            raise exc from None


def fetch_last_good(fileloc: str) -> LastGood | None:
    """The stored last good version of ``fileloc`` while a parse error is recorded for it
    (None: no parse error, no version, or no channel to ask)."""
    if _channel is None:
        return None
    try:
        answer = _channel.last_good_dag_file()
    except ChannelError as exc:
        logger.warning(
            "Cannot fetch the last good version of %s: %s",
            fileloc,
            exc,
            extra={"action": "last_good_dag_file_unavailable", "fileloc": fileloc},
        )
        return None
    if answer is None or answer.get("fileloc") != fileloc:
        return None
    return LastGood(
        fileloc,
        str(answer["source"]),
        str(answer.get("parsed_at") or "?"),
        str(answer.get("parse_error") or "?"),
    )


def _disk_text(fileloc: str) -> str | None:
    """The file's text as Python reads it now; None when it cannot be read or decoded."""
    try:
        return decode_source(Path(fileloc).read_bytes())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
