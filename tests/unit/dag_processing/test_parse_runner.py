"""The parse runner (``engine.dag_processing.parse_runner``): what it imports before it forks
anything, and what a parsing child reports of the modules it imported."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from engine.dag_processing.parsing import _parser, folder_imports, main, mark_imports, prime

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_the_parse_runner_preloads_no_heavy_library_and_stays_single_threaded() -> None:
    probe = (
        "import sys\n"
        "from engine.dag_processing.parse_runner import OPTIONAL_PRELOAD, PRELOAD\n"
        "from engine.warm.runner import preload, thread_count\n"
        "preload(PRELOAD, OPTIONAL_PRELOAD)\n"
        "heavy = ('sqlalchemy', 'alembic', 'prometheus_client', 'aiokafka', 'click')\n"
        "print(thread_count(), *[m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["1"]


def test_the_parse_runner_says_ready_on_its_control_socket(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    command = [sys.executable, "-P", "-m", "engine.dag_processing.parse_runner"]
    command += ["--control-fd", str(theirs.fileno()), "--dag-folder", str(tmp_path)]
    with subprocess.Popen(command, pass_fds=(theirs.fileno(),)) as process:
        theirs.close()
        try:
            ours.settimeout(60)
            assert ours.recv(4096) == b"ready"
        finally:
            ours.close()  # it exits when its control socket closes
            assert process.wait(timeout=60) == 0


def test_a_child_reports_the_modules_of_the_folders_it_imported(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dags, plugins = tmp_path / "dags", tmp_path / "plugins"
    (dags / "pkg").mkdir(parents=True)
    plugins.mkdir()
    (dags / "pkg" / "__init__.py").write_text("")
    (dags / "pkg" / "helper_mod_a.py").write_text("from plugin_mod_b import X\n")
    (plugins / "plugin_mod_b.py").write_text("X = 1\n")
    (dags / "unused_mod_c.py").write_text("")
    dag_file = dags / "uses.py"
    dag_file.write_text("import json\nfrom pkg import helper_mod_a\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: None)  # keep pytest's streams apart
    main(["--dags-folder", str(dags), "--plugins-folder", str(plugins), str(dag_file)])
    result = json.loads(capfd.readouterr().out)
    assert result["imports"] == sorted(
        str(path)
        for path in (
            dags / "pkg" / "__init__.py",
            dags / "pkg" / "helper_mod_a.py",
            plugins / "plugin_mod_b.py",
        )
    )
    assert folder_imports(str(dag_file), [None]) == ()


def test_only_the_modules_imported_after_the_mark_are_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child forked from the parse runner reads only the modules its file imported (the
    engine's, imported before, are not touched); a mark gone means all are looked at."""
    dags = tmp_path / "dags"
    dags.mkdir()
    before, after = dags / "before_mod.py", dags / "after_mod.py"
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    sys.modules["before_mod"] = ModuleType("before_mod")
    sys.modules["before_mod"].__file__ = str(before)
    mark = mark_imports()
    sys.modules["after_mod"] = ModuleType("after_mod")
    sys.modules["after_mod"].__file__ = str(after)
    fileloc = str(dags / "dag.py")
    assert folder_imports(fileloc, [dags], since=mark) == (str(after),)
    del sys.modules[mark]
    assert folder_imports(fileloc, [dags], since=mark) == tuple(sorted([str(after), str(before)]))


def test_the_argument_parser_is_built_once_and_primed_before_the_forks() -> None:
    prime()
    assert _parser() is _parser()
    args = _parser().parse_args(["--dags-folder", "d", "--dump-stack-at", "1.5", "f.py"])
    assert (str(args.dags_folder), args.dump_stack_at, str(args.file)) == ("d", 1.5, "f.py")
