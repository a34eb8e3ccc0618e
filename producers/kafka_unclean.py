"""What happens to a Kafka message that was not cleanly delivered: the texts that say why.

``dead_letter_headers`` are the ``sluice.dead_letter.*`` headers of a dead-lettered copy;
``unclean_stop_error`` is the error of ``on_unclean="stop"`` (see ``producers.kafka``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from producers.exceptions import UncleanEventError

if TYPE_CHECKING:
    from producers.kafka_messages import KafkaMessage
    from shared_stream.producer import AdvanceItem

DEAD_LETTER_HEADER: Final = "sluice.dead_letter."
DEAD_LETTER_ERRORS_MAX_CHARS: Final = 4_000


def outcome_text(item: AdvanceItem) -> str:
    o = item.outcome
    return f"acked={o.acked} failed={o.failed} rejected={o.rejected}"


def _reason(item: AdvanceItem) -> str:
    if item.outcome.rejected:
        return "rejected"
    return "failed" if item.outcome.failed else "no_subscribers"


def dead_letter_headers(
    item: AdvanceItem, message: KafkaMessage, group_id: str
) -> list[tuple[str, bytes]]:
    """The ``sluice.dead_letter.*`` headers added to a dead-lettered copy of ``message``."""
    rejected_by = ",".join(str(r.trigger_id) for r in message.rejections)
    errors = json.dumps(
        [{"trigger_id": r.trigger_id, "reason": r.reason} for r in message.rejections]
    )
    if len(errors) > DEAD_LETTER_ERRORS_MAX_CHARS:
        errors = errors[: DEAD_LETTER_ERRORS_MAX_CHARS - 3] + "..."
    pairs = {
        "reason": _reason(item),
        "outcome": outcome_text(item),
        "source": message.coordinates,
        "group": group_id,
        "rejected_by": rejected_by,
        "errors": errors,
    }
    return [(DEAD_LETTER_HEADER + name, text.encode()) for name, text in pairs.items()]


def unclean_stop_error(entry: tuple[AdvanceItem, KafkaMessage], where: str) -> UncleanEventError:
    item, message = entry
    reasons = "; ".join(f"trigger {r.trigger_id}: {r.reason}" for r in message.rejections)
    return UncleanEventError(
        f"Kafka message {message.coordinates} ({where}) was not cleanly delivered "
        f"({outcome_text(item)}{'; ' + reasons if reasons else ''}) and on_unclean='stop': the "
        f"shared stream stops and the broker redelivers from offset {message.offset}. Set "
        "dead_letter_topic, or on_unclean='commit' to skip such messages"
    )
