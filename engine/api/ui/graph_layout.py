"""A layered layout of a directed graph, left to right: where to draw each node and edge.

Theory of operation (the classic Sugiyama steps, kept small):

1. **Cycles.** A DAG may be scheduled on an asset one of its own tasks updates, so the graph
   can have cycles. A depth-first search (in input order, so the result is deterministic)
   finds the back edges; they are laid out reversed and drawn with their arrow pointing
   back, so every edge of the layout goes from a lower layer to a higher one.
2. **Layers.** Each node's layer is the length of the longest path reaching it: sources in
   layer 0, every edge pointing right.
3. **Long edges.** An edge spanning several layers gets one invisible waypoint per layer it
   crosses, so it bends around the nodes in between instead of crossing them.
4. **Order.** Within each layer, nodes and waypoints are ordered by the mean position of
   their neighbours in the previous layer (barycentre), sweeping right then left a few
   times, which removes most crossings of small graphs.
5. **Coordinates.** Layer ``i`` is column ``i``; its width is that of its widest node. Rows
   are evenly spaced and every column is centred vertically.

Pure: no I/O, no clock. Node widths come from the caller (``text_width`` estimates one).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

NODE_HEIGHT: Final = 28.0
ROW_GAP: Final = 16.0
COLUMN_GAP: Final = 70.0
MARGIN: Final = 12.0
SWEEPS: Final = 4
CHAR_WIDTH: Final = 7.2  # px per character of the 12 px sans-serif labels, a safe guess
LABEL_PADDING: Final = 24.0


def text_width(label: str) -> float:
    """A node width that fits ``label`` (server-side: no font metrics, a safe estimate)."""
    return round(len(label) * CHAR_WIDTH + LABEL_PADDING, 1)


@dataclass(frozen=True, slots=True)
class Node:
    """A node to place: its id (unique), and the width it needs."""

    id: str
    width: float


@dataclass(frozen=True, slots=True)
class PlacedNode:
    """A node's box: top-left corner ``(x, y)``, its size, and its layer (column)."""

    id: str
    layer: int
    x: float
    y: float
    width: float
    height: float

    @property
    def center_y(self) -> float:
        return self.y + self.height / 2


@dataclass(frozen=True, slots=True)
class PlacedEdge:
    """An edge as a polyline from its source to its target: the arrow goes at the last point.

    Edges run from a node's right side to the next column's left side; a ``reversed`` edge
    closed a cycle, so it runs right to left (from its source's left side).
    """

    source: str
    target: str
    points: tuple[tuple[float, float], ...]
    reversed: bool = False


@dataclass(frozen=True, slots=True)
class Layout:
    nodes: dict[str, PlacedNode]
    edges: tuple[PlacedEdge, ...]
    width: float
    height: float


@dataclass(slots=True)
class _Graph:
    """The working state: layered nodes (real and waypoints) and the unit-span edges."""

    layer: dict[str, int] = field(default_factory=dict)
    succ: dict[str, list[str]] = field(default_factory=dict)
    pred: dict[str, list[str]] = field(default_factory=dict)
    chains: list[tuple[str, str, list[str], bool]] = field(default_factory=list)


def layout(
    nodes: Sequence[Node], edges: Iterable[tuple[str, str]], *, column_gap: float = COLUMN_GAP
) -> Layout:
    """Place ``nodes`` and route ``edges`` (``(source_id, target_id)``) left to right,
    ``column_gap`` px between columns (wider where edges carry labels).

    Self-loops and duplicate edges are dropped; an edge naming an unknown node is an error.
    """
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("graph layout: node ids must be unique")
    known = set(ids)
    unique: dict[tuple[str, str], None] = {}  # a set that keeps the input order
    for source, target in edges:
        for end in (source, target):
            if end not in known:
                raise ValueError(f"graph layout: edge {source!r} -> {target!r} names no node")
        if source != target:
            unique[source, target] = None
    forward = _break_cycles(ids, list(unique))
    layers = _longest_path_layers(ids, [(s, t) for s, t, _ in forward])
    graph = _with_waypoints(ids, forward, layers)
    order = _order_layers(graph)
    return _coordinates(nodes, graph, order, column_gap)


def _break_cycles(ids: list[str], edges: list[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    """The edges with each DFS back edge reversed: ``(source, target, was_reversed)``."""
    out: dict[str, list[str]] = {i: [] for i in ids}
    for source, target in edges:
        out[source].append(target)
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    back: set[tuple[str, str]] = set()
    for root in ids:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            node, index = stack.pop()
            if index < len(out[node]):
                stack.append((node, index + 1))
                child = out[node][index]
                if state.get(child) == 1:
                    back.add((node, child))
                elif child not in state:
                    state[child] = 1
                    stack.append((child, 0))
            else:
                state[node] = 2
    result = []
    for source, target in edges:
        if (source, target) in back:
            result.append((target, source, True))
        else:
            result.append((source, target, False))
    return result


def _longest_path_layers(ids: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Kahn's topological order, each node one layer right of its furthest predecessor."""
    indegree = dict.fromkeys(ids, 0)
    out: dict[str, list[str]] = {i: [] for i in ids}
    for source, target in edges:
        out[source].append(target)
        indegree[target] += 1
    layer = dict.fromkeys(ids, 0)
    ready = deque(i for i in ids if indegree[i] == 0)
    while ready:
        node = ready.popleft()
        for child in out[node]:
            layer[child] = max(layer[child], layer[node] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return layer


def _with_waypoints(
    ids: list[str], edges: list[tuple[str, str, bool]], layers: dict[str, int]
) -> _Graph:
    graph = _Graph(layer=dict(layers))
    for node in ids:
        graph.succ[node] = []
        graph.pred[node] = []
    for index, (source, target, was_reversed) in enumerate(edges):
        chain = [source]
        for step in range(layers[source] + 1, layers[target]):
            waypoint = f"\0{index}:{step}"  # no real id starts with NUL
            graph.layer[waypoint] = step
            graph.succ[waypoint] = []
            graph.pred[waypoint] = []
            chain.append(waypoint)
        chain.append(target)
        for left, right in itertools.pairwise(chain):
            graph.succ[left].append(right)
            graph.pred[right].append(left)
        graph.chains.append((source, target, chain[1:-1], was_reversed))
    return graph


def _order_layers(graph: _Graph) -> list[list[str]]:
    """Each layer's nodes top to bottom, after barycentre sweeps."""
    count = max(graph.layer.values(), default=-1) + 1
    order: list[list[str]] = [[] for _ in range(count)]
    for node, layer in graph.layer.items():  # insertion order: input order, then waypoints
        order[layer].append(node)
    for sweep in range(SWEEPS):
        rightward = sweep % 2 == 0
        steps = range(1, count) if rightward else range(count - 2, -1, -1)
        for layer in steps:
            neighbours = graph.pred if rightward else graph.succ
            fixed = order[layer - 1] if rightward else order[layer + 1]
            order[layer] = _by_barycentre(order[layer], fixed, neighbours)
    return order


def _by_barycentre(
    nodes: list[str], fixed: list[str], neighbours: dict[str, list[str]]
) -> list[str]:
    position = {node: index for index, node in enumerate(fixed)}

    def key(item: tuple[int, str]) -> tuple[float, int]:
        index, node = item
        placed = [position[n] for n in neighbours[node] if n in position]
        return (sum(placed) / len(placed) if placed else float(index), index)

    return [node for _, node in sorted(enumerate(nodes), key=key)]


def _coordinates(
    nodes: Sequence[Node], graph: _Graph, order: list[list[str]], column_gap: float
) -> Layout:
    widths = {n.id: n.width for n in nodes}
    column_width = [max((widths.get(i, 0.0) for i in layer), default=0.0) for layer in order]
    column_x: list[float] = []
    x = MARGIN
    for width in column_width:
        column_x.append(x)
        x += width + column_gap
    rows = max((len(layer) for layer in order), default=0)
    height = 2 * MARGIN + rows * NODE_HEIGHT + max(rows - 1, 0) * ROW_GAP
    centre: dict[str, float] = {}
    placed: dict[str, PlacedNode] = {}
    for index, layer in enumerate(order):
        span = len(layer) * NODE_HEIGHT + max(len(layer) - 1, 0) * ROW_GAP
        top = (height - span) / 2
        for row, node in enumerate(layer):
            y = top + row * (NODE_HEIGHT + ROW_GAP)
            centre[node] = y + NODE_HEIGHT / 2
            if node in widths:
                placed[node] = PlacedNode(
                    node, index, column_x[index], y, widths[node], NODE_HEIGHT
                )
    edges = []
    for source, target, waypoints, was_reversed in graph.chains:
        start = placed[source]
        points = [(start.x + start.width, start.center_y)]
        for waypoint in waypoints:
            column = graph.layer[waypoint]
            points.append((column_x[column] + column_width[column] / 2, centre[waypoint]))
        points.append((placed[target].x, placed[target].center_y))
        edges.append(_edge(source, target, points, reversed_=was_reversed))
    width = x - column_gap + MARGIN if order else 2 * MARGIN
    return Layout(placed, tuple(edges), round(width, 1), round(height, 1))


def _edge(
    source: str, target: str, points: list[tuple[float, float]], *, reversed_: bool
) -> PlacedEdge:
    rounded = tuple((round(px, 1), round(py, 1)) for px, py in points)
    if reversed_:  # laid out target -> source: report the original edge, points reversed
        return PlacedEdge(target, source, rounded[::-1], reversed=True)
    return PlacedEdge(source, target, rounded)
