"""glibc's malloc, tuned for a long-running engine process (engine.allocator)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from engine.allocator import tune_malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

#: Frees a mapped 4 MiB block (untuned, glibc then raises its mmap threshold to 4 MiB), then
#: allocates 1 MiB and prints how much of it was mapped rather than taken from the heap.
PROBE = """
import ctypes, json, sys
from engine.allocator import tune_malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
tuned = tune_malloc({}) if sys.argv[1] == "tuned" else {}
big = bytearray(4 << 20)
del big
before = libc.mallinfo2().hblkhd
block = bytearray(1 << 20)
print(json.dumps({"tuned": tuned, "mapped": libc.mallinfo2().hblkhd - before}))
"""


def _probe(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return dict(json.loads(done.stdout))


def test_large_blocks_stay_mapped_once_tuned() -> None:
    # Untuned, the freed 4 MiB block raised the threshold: the 1 MiB block comes from the
    # heap (where it would leave a hole). Tuned, it is mapped, and unmapped when freed.
    assert _probe("untuned") == {"tuned": {}, "mapped": 0}
    tuned = _probe("tuned")
    assert tuned["tuned"] == {"mmap_threshold": 128 * 1024, "arena_max": 2}
    assert isinstance(tuned["mapped"], int) and tuned["mapped"] >= 1 << 20


@pytest.mark.parametrize("name", ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_users_own_allocator_settings_win(name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="engine.allocator")
    assert tune_malloc({name: "1"}) == {}
    assert f"The C allocator's settings are the environment's ({name})" in caplog.text
