"""The code of the README's "A first run" and of the DAG pages of docs/ works as written.

Every Python block of ``docs/writing-dags.md`` and ``docs/brokers.md`` is a DAG file a reader
may copy into the dags folder: each is parsed by the DAG processor's real child (``python -m
engine.dag_processing.parsing``) and must import what it uses and define its DAGs without an
error. The flag-file command of the README's "A first run" must put the file in
``$SLUICE_HOME``'s inbox, or ``~/.sluice``'s without one, when ``sh`` runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DAG_PAGES = (ROOT / "docs" / "writing-dags.md", ROOT / "docs" / "brokers.md")
README_SECTION = "A first run"


def _readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + len(title) + 4)
    return text[start:end]


def _texts() -> list[tuple[str, str]]:
    """(where, text) of the README's first run and of every DAG page, whole."""
    found = [(f"README {README_SECTION!r}", _readme_section(README_SECTION))]
    return found + [(f"docs/{page.name}", page.read_text(encoding="utf-8")) for page in DAG_PAGES]


def _blocks(language: str) -> list[tuple[str, str]]:
    """(where, code) of every ```language block of the README's first run and the DAG pages."""
    found = []
    for where, text in _texts():
        blocks = re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)
        found += [(f"{where} block {n + 1}", code) for n, code in enumerate(blocks)]
    return found


PYTHON_BLOCKS = _blocks("python")


def test_the_pages_have_python_blocks() -> None:
    assert len(PYTHON_BLOCKS) >= 7
    for page in DAG_PAGES:
        assert any(where.startswith(f"docs/{page.name}") for where, _ in PYTHON_BLOCKS), page


@pytest.mark.parametrize(("where", "code"), PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_each_python_block_is_a_dag_file_that_parses(where: str, code: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = tmp_path / "dags" / "snippet.py"
    path.parent.mkdir()
    path.write_text(code, encoding="utf-8")
    env = {**os.environ, "SLUICE_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "engine.dag_processing.parsing", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["error"] is None, f"{where}: {result['error']['message']}\n{code}"
    assert result["dags"], f"{where} defines no DAG"
    watched = [w for a in result["assets"] for w in a["watchers"]]
    assert all(str(home) in w["kwargs"] for w in watched if "directory" in w["kwargs"]), (
        f"{where}: a watched directory outside $SLUICE_HOME"
    )


def _flag_command() -> str:
    """The second terminal's lines of the README's first run up to the flag file's
    ``touch``: setting ``SLUICE_HOME`` and making the flag."""
    [code] = [code for _, code in _blocks("sh") if "\ntouch " in f"\n{code}"]
    lines = [line.split("#")[0].strip() for line in code.splitlines()]
    return "\n".join(lines[: next(n for n, ln in enumerate(lines) if ln.startswith("touch ")) + 1])


def test_each_terminal_of_the_first_run_exports_one_sluice_home() -> None:
    """The engine's terminal and the commands' terminal set the same ``SLUICE_HOME``: a
    command run without it would look for the database elsewhere."""
    exports = [
        line.split("#")[0].strip()
        for _, code in _blocks("sh")
        for line in code.splitlines()
        if line.startswith("export SLUICE_HOME=")
    ]
    assert len(exports) == 2 and len(set(exports)) == 1, exports
    assert "SLUICE__API__PORT" in _readme_section(README_SECTION)


@pytest.mark.parametrize("with_sluice_home", [True, False])
def test_the_flag_file_command_follows_sluice_home(tmp_path: Path, with_sluice_home: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_HOME"}
    env["HOME"] = str(tmp_path / "user")
    if with_sluice_home:
        env["SLUICE_HOME"] = str(tmp_path / "sluice home")  # a space: the path is quoted
        inbox = tmp_path / "sluice home" / "inbox"
    else:
        inbox = tmp_path / "user" / ".sluice" / "inbox"
    inbox.mkdir(parents=True)  # the example DAG creates it
    done = subprocess.run(
        ["sh", "-c", _flag_command()], env=env, capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in inbox.iterdir()] == ["eu.flag"]
