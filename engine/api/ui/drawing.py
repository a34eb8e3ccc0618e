"""The asset graph as something to draw: labelled items laid out by ``graph_layout``, and
each edge as a smooth SVG path. Pure; ``templates/ui/graph.svg.html`` writes the SVG."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from engine.api.ui.graph_layout import Layout, Node, layout, text_width

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

MAX_LABEL_CHARS: Final = 36
KINDS: Final = ("watcher", "asset", "dag", "task")


@dataclass(frozen=True, slots=True)
class GraphItem:
    """One node: ``kind`` is one of ``KINDS``; ``title`` is its tooltip (the full name and
    what it is); ``flagged`` marks trouble (a failing watcher)."""

    id: str
    kind: str
    label: str
    href: str | None = None
    title: str = ""
    flagged: bool = False

    @property
    def shown_label(self) -> str:
        if len(self.label) <= MAX_LABEL_CHARS:
            return self.label
        return self.label[: MAX_LABEL_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class DrawnEdge:
    source: str
    target: str
    path: str
    reversed: bool


@dataclass(frozen=True, slots=True)
class DrawnGraph:
    items: dict[str, GraphItem]
    layout: Layout
    edges: tuple[DrawnEdge, ...]

    def counts(self) -> dict[str, int]:
        """How many items of each kind (for the SVG's accessible title)."""
        kinds = [item.kind for item in self.items.values()]
        return {kind: kinds.count(kind) for kind in KINDS if kind in kinds}


def draw(items: Sequence[GraphItem], edges: Iterable[tuple[str, str]]) -> DrawnGraph:
    nodes = [Node(item.id, text_width(item.shown_label)) for item in items]
    placed = layout(nodes, edges)
    drawn = tuple(
        DrawnEdge(e.source, e.target, edge_path(e.points), e.reversed) for e in placed.edges
    )
    return DrawnGraph({item.id: item for item in items}, placed, drawn)


def edge_path(points: Sequence[tuple[float, float]]) -> str:
    """An SVG path through ``points``: each step a cubic curve leaving and arriving
    horizontally, so edges flow between columns without sharp bends."""
    if not points:
        return ""
    x0, y0 = points[0]
    parts = [f"M{x0:g},{y0:g}"]
    for (ax, ay), (bx, by) in itertools.pairwise(points):
        mid = (ax + bx) / 2
        parts.append(f"C{mid:g},{ay:g} {mid:g},{by:g} {bx:g},{by:g}")
    return " ".join(parts)
