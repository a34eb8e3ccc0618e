"""The C allocator's settings for a long-running engine process (glibc's malloc only).

An engine process allocates from C for what Python's small-object allocator does not serve:
every object over 512 bytes (a Kafka fetch's record batches, SQL texts, the JSON of a
batch of events, SQLite's pages and statements). glibc's malloc serves such blocks from
per-thread arenas, and from ``mmap`` above a threshold that it *raises* each time a mapped
block is freed (up to 32 MiB on 64-bit). Under steady broker traffic the two together grow
the heap for good: the fetch buffers, once the threshold has risen past their size, land
in the heap between longer-lived blocks and leave holes only blocks of their size reuse,
and each database worker thread fragments an arena of its own.

Measured with ``bench/soak_bench.py`` (``sluice run`` on SQLite, 2,000 Kafka messages a
second; see docs/performance.md, "Memory"): the Python objects stayed flat (allocated
blocks and object counts by type), while glibc's heap grew and its free bytes with it,
~4-5 bytes of RSS per message. Fixing the threshold at its initial 128 KiB (large blocks go
back to the kernel when freed) and capping the arenas at 2 keeps the heap flat.

``tune_malloc()`` applies both through ``mallopt`` when the process runs on glibc and the
user has not chosen for themselves (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` or
``GLIBC_TUNABLES`` in the environment win); elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from typing import Final

logger = logging.getLogger(__name__)

#: mallopt's parameter numbers (glibc's malloc.h)
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8

#: Blocks of this size or more are mapped, and unmapped when freed (glibc's initial value,
#: kept instead of letting it rise)
MMAP_THRESHOLD_BYTES: Final = 128 * 1024
#: The event loop's thread and one database worker at a time, mostly
ARENA_MAX: Final = 2

USER_SETTINGS: Final = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def tune_malloc(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Fix glibc's mmap threshold and cap its arenas; returns what was set (empty when
    nothing was: not glibc, or the environment names the allocator's settings)."""
    env = os.environ if environ is None else environ
    if platform.libc_ver()[0] != "glibc":
        return {}
    chosen = [name for name in USER_SETTINGS if name in env]
    if chosen:
        logger.info(
            "The C allocator's settings are the environment's (%s)",
            ", ".join(chosen),
            extra={"action": "malloc_settings_from_environment", "names": chosen},
        )
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    wanted = {"mmap_threshold": (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)}
    wanted["arena_max"] = (M_ARENA_MAX, ARENA_MAX)
    return {name: value for name, (param, value) in wanted.items() if mallopt(param, value) == 1}
