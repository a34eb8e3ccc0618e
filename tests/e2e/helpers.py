"""Helpers to run the ``sluice`` CLI as a subprocess in tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

SLUICE = str(Path(sys.executable).with_name("sluice"))


def sluice_env(home: Path, **settings: str) -> dict[str, str]:
    """A clean environment for a sluice process: only SLUICE_HOME and the given settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env["SLUICE_HOME"] = str(home)
    env.update(settings)
    return env


def run_cli(
    *args: str, env: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SLUICE, *args], env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def start_cli(*args: str, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [SLUICE, *args], env=dict(env), stdout=handle, stderr=subprocess.STDOUT
        )


def wait_for(
    condition: Callable[[], object], *, timeout: float, what: str, step: float = 0.05
) -> object:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def stop(proc: subprocess.Popen[bytes], *, timeout: float = 30) -> int:
    """SIGTERM, then wait; SIGKILL if it does not exit in time (and fail loudly)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"process {proc.pid} did not stop within {timeout}s of SIGTERM"
        ) from None
