"""What the triggerer says about a claim round, and whether a claimed row came with its
shared-stream group: pure decisions and their log lines (the triggerer's logger name, which
operators and tests filter on)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.loader import trigger_stream_digest

if TYPE_CHECKING:
    from engine.db.queries.triggers import TriggerRow
    from engine.triggerer.claiming import ClaimResult
    from triggers.base import BaseTrigger

__all__ = ("in_its_group", "report_claim")

logger = logging.getLogger("engine.triggerer.triggerer")


def report_claim(result: ClaimResult) -> None:
    """Warn about what a claim round did that an operator should know."""
    for group in result.oversized:
        logger.warning(
            "Shared-stream group %s has %d trigger(s), more than the %d this triggerer has "
            "room for and more than any live triggerer has room for: taken whole, over "
            "[triggerer] capacity (a group is never split across triggerers)",
            group.digest[:12],
            group.size,
            group.capacity_left,
            extra={"action": "group_over_capacity", "stream_digest": group.digest},
        )
    if result.released:
        logger.warning(
            "Shared-stream group split across live triggerers: gave up trigger(s) %s "
            "to the triggerer that holds most of the group",
            result.released,
            extra={"action": "group_split_repaired", "trigger_ids": result.released},
        )


def in_its_group(row: TriggerRow, trigger: BaseTrigger, rehome: dict[int, str]) -> bool:
    """Whether the row was claimed with its shared-stream group (else it goes in
    ``rehome``). A row written without a digest (by an older version, or a path that had no
    trigger object) whose trigger turns out to share a stream is handed back with its digest
    instead of started: it is then claimed with its group, by whichever triggerer holds
    that."""
    digest = trigger_stream_digest(trigger, strict=False)
    if digest == row.stream_digest:
        return True
    if row.stream_digest is None:
        assert digest is not None
        logger.info(
            "Trigger %s shares a stream (group %s): handing it back to be claimed with its group",
            row.id,
            digest[:12],
            extra={"action": "trigger_rehomed", "trigger_id": row.id},
        )
        rehome[row.id] = digest
        return False
    logger.warning(
        "Trigger %s: its shared-stream key digest %s differs from the one stored with "
        "its row (%s); it runs with the group it was claimed with",
        row.id,
        digest and digest[:12],
        row.stream_digest[:12],
        extra={"action": "stream_digest_mismatch", "trigger_id": row.id},
    )
    return True
