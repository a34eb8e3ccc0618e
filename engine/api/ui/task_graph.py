"""A DAG's tasks as a graph to draw: task groups found in the task ids, folded groups drawn
as one node, edge ``Label``s placed on their edges, and each node's state in a run.

Theory of operation: a task made inside ``with TaskGroup("load"):`` is stored with the id
``load.<task>`` (``engine.authoring.groups``; nested groups add more prefixes), so the
groups are the dotted prefixes of the task ids. A folded group stands for every task
under it: edges are mapped to the folded group holding each end (the outermost folded one),
edges inside one folded group vanish, and duplicates merge (keeping a label only when all
merged edges agree on it). A folded group's state is the most pressing of its tasks'
states (``_PRESSING``). The layout and the edge paths are ``graph_layout`` and ``drawing``'s,
the ones the asset graph uses.

Pure: no I/O; links come from the caller's ``href`` functions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from engine.api.ui.drawing import DrawnEdge, DrawnGraph, GraphItem, edge_path
from engine.api.ui.graph_layout import COLUMN_GAP, Node, layout, text_width

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence

GROUP_SEPARATOR: Final = "."
#: Room at a node's left for its state's symbol.
SYMBOL_PX: Final = 18.0
#: Room either side of an edge label between two columns.
LABEL_ROOM_PX: Final = 36.0
#: Px per character of the 11 px edge labels (a safe guess, as ``text_width``'s).
LABEL_CHAR_PX: Final = 6.6
#: A folded group's state: the first of these its tasks have (else "success" when all
#: succeeded, else the most common state).
_PRESSING: Final = (
    "failed",
    "upstream_failed",
    "up_for_retry",
    "restarting",
    "running",
    "deferred",
    "queued",
    "scheduled",
)


@dataclass(frozen=True, slots=True)
class GraphTask:
    """A task as the graph needs it: its id, what runs it, its downstream tasks and the
    ``Label`` of each edge to them."""

    task_id: str
    operator: str
    downstream: tuple[str, ...]
    edge_labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class GroupToggle:
    """A task group and whether it is folded, for the page's fold / unfold links."""

    group_id: str
    tasks: int
    folded: bool


@dataclass(frozen=True, slots=True)
class EdgeLabel:
    source: str
    target: str
    text: str
    x: float
    y: float


@dataclass(frozen=True, slots=True)
class TaskGraph:
    """What the page draws: the graph, each node's state (None: no run shown, or not
    created yet), the labels of the edges, and the groups with their fold state."""

    drawn: DrawnGraph
    states: dict[str, str | None]
    labels: tuple[EdgeLabel, ...]
    groups: tuple[GroupToggle, ...]


def groups_of(task_ids: Sequence[str]) -> dict[str, list[str]]:
    """Each task group (every dotted prefix of a task id) -> its tasks, in task order."""
    groups: dict[str, list[str]] = {}
    for task_id in task_ids:
        parts = task_id.split(GROUP_SEPARATOR)
        for end in range(1, len(parts)):
            groups.setdefault(GROUP_SEPARATOR.join(parts[:end]), []).append(task_id)
    return groups


def folded_into(task_id: str, folded: Collection[str]) -> str | None:
    """The outermost folded group holding ``task_id``, None if none does."""
    parts = task_id.split(GROUP_SEPARATOR)
    for end in range(1, len(parts)):
        group = GROUP_SEPARATOR.join(parts[:end])
        if group in folded:
            return group
    return None


def group_state(states: Sequence[str | None]) -> str | None:
    """A folded group's state from its tasks' states (None: none has one)."""
    known = [s for s in states if s is not None]
    if not known:
        return None
    for state in _PRESSING:
        if state in known:
            return state
    if all(s == "success" for s in known):
        return "success"
    return Counter(known).most_common(1)[0][0]


def build(
    tasks: Sequence[GraphTask],
    *,
    folded: Collection[str],
    states: Mapping[str, str],
    task_href: Callable[[str], str | None],
    group_href: Callable[[str], str],
) -> TaskGraph:
    """The graph of ``tasks`` with the groups of ``folded`` drawn as one node each.

    ``states``: task id -> its state in the run shown (a mapped task's copies already
    summed up by the caller); ``task_href`` links a task's node, ``group_href`` a folded
    group's node (to unfold it).
    """
    groups = groups_of([t.task_id for t in tasks])
    shut = {g for g in folded if g in groups}
    node_of = {t.task_id: folded_into(t.task_id, shut) or t.task_id for t in tasks}
    items: dict[str, GraphItem] = {}
    node_states: dict[str, str | None] = {}
    for t in tasks:
        node = node_of[t.task_id]
        if node in items:
            continue
        if node == t.task_id:
            items[node] = _task_item(t, task_href(t.task_id))
            node_states[node] = states.get(t.task_id)
        else:
            members = groups[node]
            items[node] = _group_item(node, len(members), group_href(node))
            node_states[node] = group_state([states.get(m) for m in members])
    edges = _edges(tasks, node_of)
    drawn = _draw(items, edges)
    toggles = tuple(
        GroupToggle(group, len(members), group in shut)
        for group, members in groups.items()
        if folded_into(group + GROUP_SEPARATOR, shut) in (None, group)  # not inside a fold
    )
    return TaskGraph(drawn, node_states, _labels(drawn, edges), toggles)


def _draw(
    items: Mapping[str, GraphItem], edges: Mapping[tuple[str, str], str | None]
) -> DrawnGraph:
    """The asset graph's drawing (``drawing.draw``) with room for a state symbol per node,
    and columns set wide enough apart for the longest edge label."""
    nodes = [Node(i.id, text_width(i.shown_label) + SYMBOL_PX) for i in items.values()]
    longest = max((len(text) for text in edges.values() if text), default=0)
    gap = max(COLUMN_GAP, longest * LABEL_CHAR_PX + LABEL_ROOM_PX)
    placed = layout(nodes, edges, column_gap=gap)
    lines = tuple(
        DrawnEdge(e.source, e.target, edge_path(e.points), e.reversed) for e in placed.edges
    )
    return DrawnGraph(dict(items), placed, lines)


def _task_item(task: GraphTask, href: str | None) -> GraphItem:
    title = f"{task.task_id} ({task.operator})"
    return GraphItem(task.task_id, "task", task.task_id, href, title)


def _group_item(group: str, count: int, href: str) -> GraphItem:
    label = f"{group} ({count} tasks)"
    return GraphItem(group, "group", label, href, f"task group {group}: unfold it")


def _edges(
    tasks: Sequence[GraphTask], node_of: Mapping[str, str]
) -> dict[tuple[str, str], str | None]:
    """The edges between nodes -> their label (None: no label, or merged edges disagree)."""
    labels: dict[tuple[str, str], set[str | None]] = {}
    for t in tasks:
        for down in t.downstream:
            if down not in node_of:  # a task the DAG no longer has
                continue
            source, target = node_of[t.task_id], node_of[down]
            if source != target:
                labels.setdefault((source, target), set()).add(t.edge_labels.get(down))
    return {edge: next(iter(texts)) if len(texts) == 1 else None for edge, texts in labels.items()}


def _labels(
    drawn: DrawnGraph, edges: Mapping[tuple[str, str], str | None]
) -> tuple[EdgeLabel, ...]:
    """Each labelled edge's text, placed at the middle of its path."""
    placed = []
    for edge in drawn.layout.edges:
        text = edges.get((edge.source, edge.target))
        if not text:
            continue
        x, y = _middle(edge.points)
        placed.append(EdgeLabel(edge.source, edge.target, text, x, y))
    return tuple(placed)


def _middle(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The middle of a polyline's middle segment (its waypoints sit mid-column)."""
    half = (len(points) - 1) // 2
    (ax, ay), (bx, by) = points[half], points[min(half + 1, len(points) - 1)]
    return round((ax + bx) / 2, 1), round((ay + by) / 2, 1)
