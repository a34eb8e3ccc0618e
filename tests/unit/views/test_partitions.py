"""The pure part of an asset's partitions: what one consumer's cell says of a key (a rollup's
or a fan-out's several runs in one state, a key the mapper refuses)."""

from __future__ import annotations

from engine.db.queries.partitions import KeyRun
from engine.views.partitions import _cell

RUNS = {
    "a": KeyRun("a", "run_a", "success", 1),
    "b": KeyRun("b", "run_b", "failed", 2),
    "c": KeyRun("c", "run_c", "running", 1),
}


def test_a_key_of_several_runs_shows_the_worst_and_one_without_a_run_shows_none() -> None:
    cell = _cell("d", ("a", "b", "c"), RUNS, waiting=False)
    assert (cell["state"], cell["run_id"], cell["runs"]) == ("failed", "run_a", 4)
    assert _cell("d", ("a", "c"), RUNS, waiting=False)["state"] == "running"
    partly = _cell("d", ("a", "z"), RUNS, waiting=True)
    assert partly["state"] is None and partly["waiting"] and partly["run_id"] == "run_a"
    assert _cell("d", ("a",), RUNS, waiting=False)["downstream_keys"] == ["a"]


def test_a_refused_key_says_why_and_has_no_run() -> None:
    cell = _cell("d", "'x' is not an allowed key", RUNS, waiting=True)
    assert cell["error"] == "'x' is not an allowed key"
    assert cell["state"] is None and cell["downstream_keys"] == [] and not cell["waiting"]
