"""The ``sluice`` command line run in the test process (click's ``CliRunner``), for tests
whose point is what a command does and says, not that it runs as a process of its own.

``invoke(*args, env=...)`` behaves as ``sluice ARGS`` started with ``env`` as its whole
``SLUICE*`` environment (what ``tests.e2e.helpers.run_cli`` does in a subprocess, ~0.6 s of
imports each): the command reads its configuration from that environment and configures
logging to its own standard error, and it answers with the exit code, standard output and
standard error. The process's environment and logging are restored afterwards.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from click.testing import CliRunner

from engine.cli.main import cli

if TYPE_CHECKING:
    from collections.abc import Mapping

#: loggers whose level ``engine.logs.configure_logging`` sets besides the root's
_TOUCHED_LOGGERS: Final = ("", "aiokafka", "botocore", "aiobotocore", "watchfiles", "alembic")


@dataclass(frozen=True)
class CliResult:
    """What a ``sluice`` run answered, named as ``subprocess.CompletedProcess`` names it."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def _environment(env: Mapping[str, str]) -> dict[str, str | None]:
    """The changes that make this process's ``SLUICE*`` environment exactly ``env``'s."""
    changes: dict[str, str | None] = {
        key: None for key in os.environ if key.startswith("SLUICE") and key not in env
    }
    changes.update({key: value for key, value in env.items() if key.startswith("SLUICE")})
    return changes


class _LoggingKept:
    """Saves the root logger's handlers and the levels the CLI sets, and puts them back."""

    def __enter__(self) -> None:
        self._handlers = logging.getLogger().handlers[:]
        self._levels = {name: logging.getLogger(name).level for name in _TOUCHED_LOGGERS}

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().handlers[:] = self._handlers
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


def invoke(*args: str, env: Mapping[str, str], input: str | None = None) -> CliResult:
    """``sluice ARGS`` in this process with ``env``'s ``SLUICE*`` settings; an exception the
    command does not turn into an exit code fails the test with its traceback."""
    with _LoggingKept():
        result = CliRunner().invoke(
            cli, list(args), env=_environment(env), input=input, obj={}, catch_exceptions=False
        )
    return CliResult(tuple(args), result.exit_code, result.stdout, result.stderr)
