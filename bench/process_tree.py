"""An engine's process tree as the user-facing benches measure it, from /proc: its members,
their CPU time and resident memory, and stopping it the way a user stops ``sluice run``.

Shared by bench/kafka_drain_bench.py, bench/soak_bench.py, bench/dag_files_bench.py and
bench/compare_airflow_user.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
STOP_GRACE_S = 60.0


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (OSError once it is gone)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, read from /proc (processes that vanish are skipped)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            children.setdefault(int(_stat_fields(int(entry))[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_cpu_s(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds of ``pid``'s live process tree; with ``reaped``, also of
    the children each member has waited for (a DAG processor's parse forks, say)."""
    last = 15 if reaped else 13  # utime stime [cutime cstime]
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            total += sum(int(value) for value in _stat_fields(member)[11:last])
    return total / CLOCK_TICKS


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``'s live process tree."""
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * PAGE_BYTES
    return total


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (an orderly stop), then SIGKILL to its process group after ``STOP_GRACE_S``."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
