from __future__ import annotations

import gc
import weakref

import pytest

from engine.triggerer.collector import collector_tuned


def test_tuning_freezes_raises_the_young_threshold_and_the_last_one_out_restores() -> None:
    before = gc.get_threshold()
    with collector_tuned(50_000):
        assert gc.get_threshold()[0] == max(50_000, before[0])
        assert gc.get_freeze_count() > 0
        with collector_tuned(60_000):  # a second triggerer in the same process
            assert gc.get_threshold()[0] == max(60_000, before[0])
        assert gc.get_threshold()[0] >= 50_000  # the first one still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_none_changes_nothing_and_a_bad_threshold_is_refused() -> None:
    before = gc.get_threshold()
    with collector_tuned(None):
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError, match="young_threshold"), collector_tuned(0):
        pass


def test_objects_the_process_froze_itself_stay_frozen_and_garbage_is_not_frozen() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a reference cycle: only the collector frees it

    gc.freeze()  # the host application's own
    theirs = gc.get_freeze_count()
    try:
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        with collector_tuned(50_000):
            assert gone() is None  # collected first, not frozen for the process's lifetime
            assert gc.get_freeze_count() >= theirs
        assert gc.get_freeze_count() >= theirs  # not unfrozen by the last one out
    finally:
        gc.unfreeze()
