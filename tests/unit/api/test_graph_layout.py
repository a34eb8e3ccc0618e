"""The asset graph's layered layout: layers, waypoints, cycles, order, and no overlaps."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.api.ui.graph_layout import (
    COLUMN_GAP,
    NODE_HEIGHT,
    Node,
    layout,
    text_width,
)


def nodes(*ids: str, width: float = 50.0) -> list[Node]:
    return [Node(i, width) for i in ids]


def test_a_chain_goes_left_to_right_one_column_per_step() -> None:
    placed = layout(nodes("w", "a", "d"), [("w", "a"), ("a", "d")])
    assert [placed.nodes[i].layer for i in ("w", "a", "d")] == [0, 1, 2]
    assert placed.nodes["w"].x < placed.nodes["a"].x < placed.nodes["d"].x
    assert placed.nodes["a"].x - placed.nodes["w"].x == pytest.approx(50.0 + COLUMN_GAP)


def test_an_edge_starts_at_its_source_right_side_and_ends_at_its_target_left_side() -> None:
    placed = layout(nodes("a", "b"), [("a", "b")])
    (edge,) = placed.edges
    a, b = placed.nodes["a"], placed.nodes["b"]
    assert (edge.source, edge.target, edge.reversed) == ("a", "b", False)
    assert edge.points == ((a.x + a.width, a.center_y), (b.x, b.center_y))


def test_the_layer_is_the_longest_path_and_long_edges_get_a_waypoint_per_layer() -> None:
    # a -> b -> c -> d and a shortcut a -> d: d is in layer 3, the shortcut bends twice
    placed = layout(nodes("a", "b", "c", "d"), [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])
    assert placed.nodes["d"].layer == 3
    shortcut = next(e for e in placed.edges if (e.source, e.target) == ("a", "d"))
    assert len(shortcut.points) == 4  # start, two waypoints, end


def test_a_waypoint_never_sits_on_a_node_of_its_column() -> None:
    placed = layout(nodes("a", "b", "c", "d"), [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])
    shortcut = next(e for e in placed.edges if (e.source, e.target) == ("a", "d"))
    for x, y in shortcut.points[1:-1]:
        for node in placed.nodes.values():
            inside_x = node.x <= x <= node.x + node.width
            assert not (inside_x and node.y <= y <= node.y + node.height)


def test_a_cycle_is_laid_out_with_one_edge_reversed_and_keeps_its_direction() -> None:
    # a DAG scheduled on an asset its own task updates: asset -> dag -> task -> asset
    cycle = [("asset", "dag"), ("dag", "task"), ("task", "asset")]
    placed = layout(nodes("asset", "dag", "task"), cycle)
    assert sorted(n.layer for n in placed.nodes.values()) == [0, 1, 2]
    back = [e for e in placed.edges if e.reversed]
    assert [(e.source, e.target) for e in back] == [("task", "asset")]
    (edge,) = back
    task, asset = placed.nodes["task"], placed.nodes["asset"]
    # drawn from the task towards the asset: the arrow (last point) ends at the asset
    assert edge.points[0] == (task.x, task.center_y)
    assert edge.points[-1] == (asset.x + asset.width, asset.center_y)


def test_two_nodes_pointing_at_each_other_both_edges_are_drawn() -> None:
    placed = layout(nodes("a", "b"), [("a", "b"), ("b", "a")])
    assert {(e.source, e.target) for e in placed.edges} == {("a", "b"), ("b", "a")}


def test_self_loops_and_duplicates_are_dropped() -> None:
    placed = layout(nodes("a", "b"), [("a", "a"), ("a", "b"), ("a", "b")])
    assert [(e.source, e.target) for e in placed.edges] == [("a", "b")]


def test_many_edges_are_laid_out_quickly() -> None:
    """Deduplicating edges is linear: 24,000 edges (half of them repeated) among 220 nodes
    took over 10 s when each edge was searched for in a list; now well under a second (the
    bound is generous for a loaded machine)."""
    sources, targets = [f"s{i}" for i in range(120)], [f"t{i}" for i in range(100)]
    edges = [(s, t) for s in sources for t in targets]
    started = time.perf_counter()
    placed = layout(nodes(*sources, *targets), edges + edges)
    assert time.perf_counter() - started < 5.0
    assert len(placed.edges) == len(edges)


def test_an_edge_to_an_unknown_node_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'a' -> 'ghost'"):
        layout(nodes("a"), [("a", "ghost")])


def test_duplicate_node_ids_are_an_error() -> None:
    with pytest.raises(ValueError, match="unique"):
        layout(nodes("a", "a"), [])


def test_an_empty_graph_has_a_small_empty_canvas() -> None:
    placed = layout([], [])
    assert placed.nodes == {} and placed.edges == ()
    assert placed.width > 0 and placed.height > 0


def test_barycentre_order_uncrosses_two_parallel_chains() -> None:
    # input order would cross: a1 -> b2 and a2 -> b1 with b1 listed first
    placed = layout(nodes("a1", "a2", "b2", "b1"), [("a1", "b1"), ("a2", "b2")])
    assert placed.nodes["a1"].y < placed.nodes["a2"].y
    assert placed.nodes["b1"].y < placed.nodes["b2"].y


def test_a_column_is_as_wide_as_its_widest_node() -> None:
    placed = layout([Node("a", 40), Node("b", 200), Node("c", 40)], [("a", "c"), ("b", "c")])
    assert placed.nodes["c"].x == pytest.approx(placed.nodes["a"].x + 200 + COLUMN_GAP)


def test_the_same_input_gives_the_same_layout() -> None:
    graph = (nodes("x", "y", "z", "w"), [("x", "z"), ("y", "z"), ("z", "w"), ("x", "w")])
    assert layout(*graph) == layout(*graph)


def test_text_width_grows_with_the_label() -> None:
    assert text_width("a much longer label") > text_width("short") > 0


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[Node], list[tuple[str, str]]]:
    count = draw(st.integers(min_value=1, max_value=12))
    ids = [f"n{i}" for i in range(count)]
    pairs = st.tuples(st.sampled_from(ids), st.sampled_from(ids))
    edges = draw(st.lists(pairs, max_size=30))
    widths = draw(st.lists(st.floats(min_value=10, max_value=300), min_size=count, max_size=count))
    return [Node(i, w) for i, w in zip(ids, widths, strict=True)], edges


@given(graphs())
def test_any_graph_every_node_placed_no_overlap_every_edge_routed(graph) -> None:
    node_list, edges = graph
    placed = layout(node_list, edges)
    assert set(placed.nodes) == {n.id for n in node_list}
    boxes = list(placed.nodes.values())
    for i, a in enumerate(boxes):
        assert 0 <= a.x and a.x + a.width <= placed.width
        assert 0 <= a.y and a.y + a.height <= placed.height
        for b in boxes[i + 1 :]:
            apart_x = a.x + a.width <= b.x or b.x + b.width <= a.x
            apart_y = a.y + NODE_HEIGHT <= b.y or b.y + NODE_HEIGHT <= a.y
            assert apart_x or apart_y, (a, b)
    wanted = {(s, t) for s, t in edges if s != t}
    assert {(e.source, e.target) for e in placed.edges} == wanted
    for edge in placed.edges:
        xs = [x for x, _ in edge.points]
        # forward edges run left to right, cycle-closing ones right to left
        assert xs == sorted(xs, reverse=edge.reversed)
