"""Every command of the "Running in production" page (docs/production.md), run as written.

The commands are read from the page itself (so the documentation cannot drift from what works):
the environment lines are evaluated by the shell, the engine processes (`sluice run` and
each part alone) run side by side on one PostgreSQL database, and every operator command
must exit 0 against them. Only the placeholders are substituted: the database URL, the
dags folder, DAG_ID / RUN_ID / TASK_ID / ASSET and the metrics port.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.helpers import stop_all, wait_for, wait_ready

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "production.md"
LONG_RUNNING = ("run", "triggerer", "scheduler", "executor", "dag-processor", "api-server")

DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger

flag = Asset("flag", watchers=[AssetWatcher("flag-file", DirectoryFileDeleteTrigger(
    directory={inbox!r}, filename="go.flag", poke_interval=0.1))])


@task
def report(triggering_asset_events, dag_id):
    print("report of", dag_id)
    return len(triggering_asset_events.get("flag", []))


with DAG("on_flag", schedule=flag):
    report()
"""


def production_commands() -> list[str]:
    """The lines of the page's ``sh`` blocks, in order."""
    text = PAGE.read_text()
    assert text.startswith("# Running in production\n"), "the page the test expects"
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def shell_env(tmp_path: Path) -> dict[str, str]:
    """A clean environment whose PATH finds this checkout's ``sluice`` and ``python``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SLUICE_HOME"] = str(tmp_path / "home")
    return env


class Substitutions:
    def __init__(
        self, pg_url: str, dags: Path, metrics_port: int, api_ports: tuple[int, int]
    ) -> None:
        secrets = dags.parent
        self.values = {
            "postgresql+psycopg://sluice@db.internal/sluice": pg_url,
            "/srv/dags": str(dags),
            "127.0.0.1:9464": f"127.0.0.1:{metrics_port}",
            "127.0.0.1:8793": f"127.0.0.1:{api_ports[0]}",  # the API of `sluice run`
            "--port 8080": f"--port {api_ports[1]}",  # `sluice api-server` beside it
            "< alice.password": f"< {secrets / 'alice.password'}",
            "< deployer.password": f"< {secrets / 'deployer.password'}",
            "DAG_ID": "on_flag",
            "TASK_ID": "report",
            "ASSET": "flag",
        }

    def apply(self, line: str) -> str:
        for placeholder, value in self.values.items():
            line = line.replace(placeholder, value)
        return line


def _sh(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The page's long-running processes: SIGTERMed all at once at the end (each shuts down
    on its own, side by side, as a deploy stops them), then each must exit 0."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    codes = stop_all(started, timeout=60)
    assert codes == [0] * len(started), codes


def test_every_production_command_of_the_docs_works(
    pg_url: str,
    tmp_path: Path,
    shell_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]],
) -> None:
    commands = production_commands()
    assert len(commands) >= 20, commands  # the page holds what the test expects
    dags, inbox = tmp_path / "dags", tmp_path / "inbox"
    dags.mkdir()
    inbox.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox))))
    port, api_port = _free_port(), _free_port()
    for user in ("alice", "deployer"):
        (tmp_path / f"{user}.password").write_text(f"the password of {user}\n")
    subs = Substitutions(pg_url, dags, port, (api_port, _free_port()))
    env = dict(shell_env)
    env["SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC"] = "1"
    env["SLUICE__SCHEDULER__SCHEDULER_HEARTBEAT_SEC"] = "1"
    env["SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC"] = "5"
    env["SLUICE__METRICS__PORT"] = str(port)
    env["SLUICE__API__PORT"] = str(api_port)
    ran: list[str] = []
    # Processes started and not yet seen ready: they start side by side, as a deploy starts
    # them, and the next command waits for all of them.
    starting: list[tuple[subprocess.Popen[bytes], Path, bool]] = []
    flag_run_id: str | None = None  # the run a flag file made (the manual one may be first)

    for raw in commands:
        line = subs.apply(raw)
        words = shlex.split(line)
        if words[0] == "export":
            name, _, value = line.removeprefix("export ").partition("=")
            evaluated = _sh(f"printf %s {value}", env)
            assert evaluated.returncode == 0 and evaluated.stdout, (raw, evaluated.stderr)
            env[name] = evaluated.stdout
        elif _subcommand(words) in LONG_RUNNING:
            index = len(processes)
            log = tmp_path / f"proc{index}.log"
            at = words.index("sluice")
            assignments = dict(w.split("=", 1) for w in words[:at])  # e.g. VAR=x sluice run
            with log.open("ab") as handle:
                processes.append(
                    subprocess.Popen(
                        [str(Path(sys.executable).with_name("sluice")), *words[at + 1 :]],
                        env={**env, **assignments},
                        stdout=handle,
                        stderr=handle,
                    )
                )
            starting.append((processes[-1], log, "--log-format" in words))
        else:
            _wait_all_ready(starting)  # the engines the page starts one after another
            if flag_run_id is None and words[0] == "sluice" and words[1] in ("runs", "tasks"):
                # Something for the run, asset and task commands to show: a watcher-made run.
                flag_run_id = _fire_and_wait(inbox, env)
            if "RUN_ID" in line:
                assert flag_run_id is not None, "RUN_ID before any run command"
                line = line.replace("RUN_ID", flag_run_id)
            result = _sh(line, env)
            assert result.returncode == 0, (raw, result.stdout, result.stderr)
            _check_output(raw, result.stdout)
        ran.append(raw)

    _wait_all_ready(starting)
    assert ran == commands
    assert len(processes) == len(LONG_RUNNING)
    # Two engines' worth of parts shared the work: two of each part are alive.
    jobs = json.loads(_sh("sluice jobs list --json", env).stdout)
    alive = Counter(j["type"] for j in jobs if j["alive"])
    parts = ("triggerer", "scheduler", "executor", "dag_processor", "api")
    assert alive == dict.fromkeys(parts, 2), jobs


def _wait_all_ready(starting: list[tuple[subprocess.Popen[bytes], Path, bool]]) -> None:
    """Wait until each started process said it is ready; one started with ``--log-format
    json`` wrote nothing but JSON lines until then."""
    for proc, log, json_log in starting:
        wait_ready(proc, log)
        if json_log:
            lines = log.read_text().splitlines()
            records = [json.loads(x) for x in lines if x.strip()]
            assert any(r["message"].startswith("Sluice ready") for r in records), lines
    starting.clear()


def _subcommand(words: list[str]) -> str | None:
    """The command of a ``sluice`` line (``run`` in ``X=1 sluice --log-format json run``)."""
    if "sluice" not in words:
        return None
    rest = words[words.index("sluice") + 1 :]
    while rest and rest[0] in ("--log-format", "--log-level"):
        rest = rest[2:]
    return rest[0] if rest else None


def _fire_and_wait(inbox: Path, env: dict[str, str]) -> str:
    """Drop the flag file; the run_id of the successful run its asset event made."""
    (inbox / "go.flag").touch()

    def made_by_the_flag() -> str | None:
        out = _sh("sluice runs list on_flag --json", env)
        assert out.returncode == 0, out.stderr
        return next(
            (
                str(run["run_id"])
                for run in json.loads(out.stdout)
                if run["state"] == "success" and run["asset_events"]
            ),
            None,
        )

    run_id = wait_for(made_by_the_flag, timeout=60, what="the flag file to make a successful run")
    assert isinstance(run_id, str)
    return run_id


def _check_output(raw: str, stdout: str) -> None:
    """A few commands' output says something specific; the rest must just succeed."""
    if raw.startswith("sluice db check"):
        assert "schema is current" in stdout
    elif raw.startswith("sluice doctor"):
        assert "no problems found" in stdout
    elif raw.startswith("sluice streams list --json"):
        groups = json.loads(stdout)
        assert any("directory-scan" in g["key"] for g in groups), groups
    elif raw.startswith("sluice tasks logs"):
        assert "report of on_flag" in stdout
    elif raw.startswith("curl") and "/metrics" in raw:
        assert "sluice_triggers_running" in stdout
    elif raw.startswith("curl") and "/api/v1/me" in raw:
        assert json.loads(stdout) == {
            "username": "deployer",
            "role": "op",
            "auth": "token",
            "csrf_token": None,
        }
    elif raw.startswith("curl") and "/health/ready" in raw:
        assert json.loads(stdout)["status"] == "ready"
    elif raw.startswith("sluice tokens list"):
        assert "deployer" in stdout and "active" in stdout
    elif raw.startswith("sluice assets events"):
        assert "flag-file" in stdout


def test_the_section_lists_each_documented_command_once() -> None:
    commands = production_commands()
    assert len(commands) == len(set(commands))
    for needed in ("sluice run", "sluice doctor", "sluice streams list", "sluice jobs list"):
        assert any(needed in c for c in commands), needed
