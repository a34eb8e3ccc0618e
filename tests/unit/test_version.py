"""``sluice --version`` and ``sluice version``: the installed distribution's version."""

from __future__ import annotations

from importlib.metadata import version

from click.testing import CliRunner

from engine.cli.main import cli


def test_version_option_prints_the_installed_distribution_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"sluice {version('sluice')}\n"


def test_version_command_prints_the_same_version() -> None:
    result = CliRunner().invoke(cli, ["version"], obj={})
    assert result.exit_code == 0, result.output
    assert result.output == f"{version('sluice')}\n"
