"""Every ``--help`` reads as terminal text: the docstrings that serve as help keep their
reStructuredText code marks (````x````) for the documentation, and ``--help`` drops them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from click.testing import CliRunner

from engine.cli.main import cli

if TYPE_CHECKING:
    from collections.abc import Iterator


def _every_command() -> Iterator[tuple[str, ...]]:
    """The path of every command and group under the root, the root first."""

    def walk(group: click.Group, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        for name in group.list_commands(click.Context(group)):
            command = group.get_command(click.Context(group), name)
            assert command is not None, (*path, name)
            yield (*path, name)
            if isinstance(command, click.Group):
                yield from walk(command, (*path, name))

    yield ()
    yield from walk(cli, ())


def test_no_help_shows_restructuredtext_code_marks() -> None:
    runner = CliRunner()
    marked, helped = [], 0
    for path in _every_command():
        result = runner.invoke(cli, [*path, "--help"], obj={})
        assert result.exit_code == 0, (path, result.output)
        helped += 1
        if "``" in result.output:
            marked.append(" ".join(path))
    assert marked == []
    assert helped > 60  # every command was walked, the nested ones too


def test_the_help_keeps_the_marked_words() -> None:
    """``sluice tasks state``'s docstring marks ``task_state_store`` and ``sluice db clean``."""
    result = CliRunner().invoke(cli, ["tasks", "state", "--help"], obj={})
    text = " ".join(result.output.split())
    assert "(task_state_store)" in text
    assert "when sluice db clean may delete it" in text
