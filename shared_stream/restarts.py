"""Why a key's group starts: what the ``Shared stream group started`` line says.

A key's group starts for the first time when its first subscriber comes. It starts again
only when its previous group ended (the last subscriber left, the upstream failed, the
owner was fenced) and a subscriber came back: then the line says so, with how the previous
group ended and how long ago, so that two lines for one key read as the restart they are.
A retry of an upstream that could not be reached is quiet (DEBUG): the subscribers' trigger
runtime already warned once for the streak. Pure: the manager passes its clock's ``now``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from triggers.exceptions import is_reported_by_the_trigger

if TYPE_CHECKING:
    from shared_stream.group import SharedStreamGroup

#: how much of the error that ended the previous group the line repeats
ERROR_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class GroupEnd:
    """How a key's group ended (or is ending: still draining) and when."""

    how: str  # "stopped: its last subscriber left", "failed: BrokerUnavailable: ..."
    at: float  # the manager's clock
    unreachable: bool  # its upstream could not be reached or refused (the runtime warned)


def group_end(group: SharedStreamGroup, now: float) -> GroupEnd:
    """How ``group`` ended, seen at ``now``: its error, else why it was stopped."""
    error = group.error
    if error is not None:
        text = f"{type(error).__name__}: {error}"
        if len(text) > ERROR_CHARS:
            text = text[: ERROR_CHARS - 3] + "..."
        return GroupEnd(f"failed: {text}", now, is_reported_by_the_trigger(error))
    return GroupEnd(group.stop_reason or "ended: its upstream stream ended", now, False)


def start_note(previous: GroupEnd | None, now: float) -> tuple[int, str]:
    """The level and the suffix of the line of a group that starts after ``previous``."""
    if previous is None:
        return logging.INFO, ""
    if previous.unreachable:
        return logging.DEBUG, " (retrying its unreachable upstream)"
    ago = max(now - previous.at, 0.0)
    return logging.INFO, f" (again, {ago:.1f}s after its previous group {previous.how})"
