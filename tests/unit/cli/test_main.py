"""The root group (``engine.cli.main``): every command is where ``COMMANDS`` says, and is
imported only when it runs or ``--help`` lists it."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from engine.cli.main import COMMANDS, cli

#: what no single command but its own should import (the nouns, the database, the read model)
_HEAVY = (
    "engine.cli.dags",
    "engine.cli.tasks",
    "engine.cli.db",
    "engine.cli.users",
    "sqlalchemy",
    "engine.views",
)


def _loaded(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {_HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.split()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_is_where_the_table_says(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert isinstance(command, click.Command)
    assert command.name == name


def test_help_lists_every_command_once() -> None:
    listed = cli.list_commands(click.Context(cli))
    assert listed == sorted({*COMMANDS, "version"})


def test_the_version_imports_no_command_module() -> None:
    code = (
        "from click.testing import CliRunner\nfrom engine.cli.main import cli\n"
        "assert CliRunner().invoke(cli, ['--version']).exit_code == 0"
    )
    assert _loaded(code) == []


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "from click.testing import CliRunner\nfrom engine.cli.main import cli\n"
        "assert CliRunner().invoke(cli, ['config', '--help']).exit_code == 0"
    )
    assert _loaded(code) == []


def test_an_unknown_command_is_still_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["dag"], obj={})
    assert result.exit_code == 2
    assert "No such command 'dag'" in result.output


@pytest.mark.parametrize(("args", "code"), [(["version"], 0), (["dag"], 2)])
def test_the_console_script_exits_with_the_heap_frozen(args: list[str], code: int) -> None:
    """``main`` freezes what is alive before the interpreter's finalization (which would
    otherwise run full collections over the whole heap: seconds after an engine stopped),
    and the command's exit code still reaches the shell. An atexit handler runs after
    ``main`` returned and before that finalization: it sees the freeze."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
        f"sys.argv = ['sluice', *{args!r}]\n"
        "from engine.cli.main import main\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == code, out.stderr
    frozen = int(out.stdout.rsplit("frozen ", 1)[1])
    assert frozen > 1000, out.stdout
