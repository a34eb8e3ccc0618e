"""How a state looks on every page: one CSS class, one symbol and one word per state.

Colour is never the only signal (WCAG 1.4.1): each state also has a symbol drawn inside
its dot or cell and a text label (shown, or as the element's accessible name). The colours
live in ``static/sluice.css`` under ``.state-<name>``, the same for DAG runs, task
instances, jobs and triggers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class StateLook:
    css: str  # the CSS class: "state-" + a known state, or "state-unknown"
    symbol: str
    label: str


_LOOKS: Final = {
    "success": ("✓", "success"),
    "failed": ("✗", "failed"),
    "running": ("▶", "running"),
    "queued": ("…", "queued"),
    "scheduled": ("◷", "scheduled"),
    "deferred": ("‖", "deferred"),
    "up_for_retry": ("↻", "up for retry"),
    "upstream_failed": ("!", "upstream failed"),
    "skipped": ("»", "skipped"),
    "restarting": ("⟳", "restarting"),
    "removed": ("\u2212", "removed"),  # a minus sign
    "none": ("○", "no status"),
}

#: The states of the legend, in the order a run goes through them.
LEGEND_ORDER: Final = tuple(_LOOKS)


def look(state: str | None) -> StateLook:
    """The look of ``state`` (None: a task instance not created yet, shown as no status)."""
    name = "none" if state is None else str(state)
    found = _LOOKS.get(name)
    if found is None:  # a state a newer engine wrote: shown by name, in neutral grey
        return StateLook("state-unknown", "?", name.replace("_", " "))
    symbol, label = found
    return StateLook(f"state-{name}", symbol, label)


def legend() -> list[StateLook]:
    return [look(state) for state in LEGEND_ORDER]
