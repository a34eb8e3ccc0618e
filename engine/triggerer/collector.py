"""The garbage collector's settings while a triggerer runs (a process-wide knob).

A busy triggerer keeps thousands of young objects alive for a few milliseconds each (a
Kafka message, its decoded value and payload, its trigger event, its outbox item, its
ledger entry: ~15 objects per message between fetch and commit). With the interpreter's
default thresholds (700 allocations for a young collection) they outlive the young
generations, reach the old one, and every few thousand messages trigger a *full* collection
that walks every object of the process, the ~150k of the imported modules included:
measured on the Kafka bench, full collections took half of the process's CPU time and
stopped the event loop for up to 0.3 s each.

``collector_tuned(young_threshold)`` freezes the objects that exist when the triggerer
starts (modules, classes, settings: they live as long as the process, ``gc.freeze``) and
raises the young generation's threshold so that short-lived objects die young; both are
undone when the last such block (several triggerers may share a process) exits. The
setting is the process's: under ``sluice run`` every part of the process collects at that
pace while the triggerer runs (``[triggerer] gc_young_threshold``, 0 to leave the
interpreter's settings). Reference
counting frees acyclic garbage at once whatever the thresholds: they only pace the
collection of reference cycles.
"""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator

DEFAULT_YOUNG_THRESHOLD: Final = 50_000


class _Tuning:
    """How many ``collector_tuned`` blocks are open, and the thresholds before the first."""

    holders = 0
    saved: tuple[int, ...] = ()
    #: False when the process had frozen objects itself: they stay frozen after the last
    #: block exits (``gc.unfreeze`` cannot tell theirs from ours)
    unfreeze = True


@contextlib.contextmanager
def collector_tuned(young_threshold: int | None) -> Iterator[None]:
    """Freeze the objects alive now and collect the young generation every
    ``young_threshold`` allocations (net of frees) while inside; None changes nothing."""
    if young_threshold is None:
        yield
        return
    if young_threshold < 1:
        raise ValueError(f"young_threshold must be >= 1, got {young_threshold}")
    if _Tuning.holders == 0:
        _Tuning.saved = gc.get_threshold()
        _Tuning.unfreeze = gc.get_freeze_count() == 0
        gc.collect()  # garbage cycles alive now would be frozen, that is kept, until the end
    _Tuning.holders += 1
    gc.freeze()
    current = gc.get_threshold()
    gc.set_threshold(max(young_threshold, current[0]), *current[1:])
    try:
        yield
    finally:
        _Tuning.holders -= 1
        if _Tuning.holders == 0:  # the last one out restores (triggerers may overlap)
            gc.set_threshold(*_Tuning.saved)
            if _Tuning.unfreeze:
                gc.unfreeze()
