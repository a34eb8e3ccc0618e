"""Debian's Chromium for the browser tests: installed with apt when missing, never skipped.

Playwright's own browser downloads cannot work here (no internet but the package
registries), so the tests drive ``/usr/bin/chromium`` from the Debian package. A machine
without it gets it from apt (we run as root, as CI does); when that fails the run fails
with apt's own words and what to do.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Final

CHROMIUM: Final = Path("/usr/bin/chromium")
APT_TIMEOUT_S: Final = 900.0  # `apt-get update` + ~100 MB of packages on a slow mirror
#: Wait this long for another apt (a parallel job, unattended upgrades) to let go of its lock.
APT_LOCK_WAIT_S: Final = 600
#: One installer at a time among this machine's test processes.
INSTALL_LOCK: Final = Path("/tmp/sluice-tests-chromium-install.lock")

#: Headless Chromium as root, with nothing talking to the internet on its own.
LAUNCH_ARGS: Final = (
    "--no-sandbox",  # root cannot use the setuid sandbox
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)


class ChromiumUnavailableError(RuntimeError):
    """Chromium is missing and could not be installed; the message says why."""


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    """``apt-get -y ARGS``, retried while another apt holds a lock (``DPkg::Lock::Timeout``
    covers dpkg's lock, not the package lists' lock that ``apt-get update`` takes)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}", "-y", *args]
    deadline = time.monotonic() + APT_LOCK_WAIT_S
    while True:
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ChromiumUnavailableError(f"`{' '.join(command)}` did not run: {exc}") from exc
        locked = done.returncode != 0 and "Could not get lock" in done.stdout + done.stderr
        if not locked or time.monotonic() > deadline:
            return done
        time.sleep(2.0)  # another apt holds the lock: ask again


def ensure_chromium() -> Path:
    """``/usr/bin/chromium``, installed with ``apt-get install -y chromium`` when missing."""
    if CHROMIUM.exists():
        return CHROMIUM
    if shutil.which("apt-get") is None:
        raise ChromiumUnavailableError(
            f"{CHROMIUM} is missing and this machine has no apt-get: install Debian's "
            "`chromium` package (the browser tests drive it through Playwright)"
        )
    with INSTALL_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing it
        if CHROMIUM.exists():
            return CHROMIUM
        for step in (("update",), ("install", "chromium")):
            done = _apt(*step)
            if done.returncode != 0:
                raise ChromiumUnavailableError(
                    f"{CHROMIUM} is missing and `apt-get {' '.join(step)}` failed "
                    f"(exit {done.returncode}); run `apt-get update && apt-get install -y "
                    f"chromium` as root. apt said:\n{(done.stdout + done.stderr)[-2000:]}"
                )
    if not CHROMIUM.exists():
        raise ChromiumUnavailableError(
            f"`apt-get install chromium` succeeded but {CHROMIUM} is still missing"
        )
    return CHROMIUM
