"""The pure part of the operator actions: which tasks a clear or a mark reaches."""

from __future__ import annotations

import pytest

from engine.db.queries.task_graph import relatives

# a >> b >> d, a >> c >> d, d >> e; f alone
GRAPH = {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": ["e"], "e": [], "f": []}


@pytest.mark.parametrize(
    ("roots", "downstream", "upstream", "expected"),
    [
        (["b"], False, False, {"b"}),
        (["b"], True, False, {"b", "d", "e"}),
        (["b"], False, True, {"a", "b"}),
        (["d"], True, True, {"a", "b", "c", "d", "e"}),
        (["c", "f"], True, False, {"c", "d", "e", "f"}),
        ([], True, True, set()),
    ],
)
def test_relatives_are_transitive(
    roots: list[str], downstream: bool, upstream: bool, expected: set[str]
) -> None:
    assert relatives(GRAPH, roots, downstream=downstream, upstream=upstream) == expected


def test_upstream_and_downstream_do_not_mix() -> None:
    """``b``'s upstream ``a`` does not bring ``a``'s other downstream task ``c``."""
    found = relatives(GRAPH, ["b"], downstream=True, upstream=True)
    assert found == {"a", "b", "d", "e"}
