"""Times as a person reads them: ``2026-11-29 05:16 UTC, 3 min ago`` (the ISO value stays
on the element for the hover and for machines), in a whole sentence too: the read model's
messages (the "why" page's verdict and findings) carry ISO times, which
``with_readable_times`` wraps in ``<time>`` elements.

Pure: ``now`` is a parameter (the page passes the time its answer was read at).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

from markupsafe import Markup, escape

READABLE_FORMAT: Final = "%Y-%m-%d %H:%M UTC"
#: An ISO 8601 date and time with its offset, as ``datetime.isoformat`` writes the read
#: model's (aware) times into its messages. Without an offset it is left alone: a
#: partition key such as ``2026-03-10T09:00:00`` names a slice, not a moment.
ISO_TIME: Final = re.compile(
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:\d{2})"
)
_MINUTE_S: Final = 60
_HOUR_S: Final = 3600
_DAY_S: Final = 86400


def _utc(value: datetime) -> datetime:
    """An aware time in UTC; a naive one is taken as UTC (what the database stores)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_time(value: str | datetime) -> datetime | None:
    """``value`` as an aware UTC datetime; None for text that is no ISO time."""
    if isinstance(value, datetime):
        return _utc(value)
    try:
        return _utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


def span_words(seconds: float) -> str:
    """A span rounded as people say it: ``40 s``, ``3 min``, ``5 h``, ``2 days``."""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * _MINUTE_S:
        return f"{seconds / _MINUTE_S:.0f} min"
    if seconds < 36 * _HOUR_S:
        return f"{seconds / _HOUR_S:.0f} h"
    days = round(seconds / _DAY_S)
    return f"{days} day{'s' if days != 1 else ''}"


def readable_time(value: str | datetime, now: str | datetime) -> str:
    """``2026-11-29 05:16 UTC, 3 min ago`` (``in 3 min`` ahead of ``now``, ``just now``
    within a second); text that is no ISO time comes back as it is."""
    at, reference = parse_time(value), parse_time(now)
    if at is None:
        return str(value)
    text = at.strftime(READABLE_FORMAT)
    if reference is None:
        return text
    delta = (reference - at).total_seconds()
    if abs(delta) < 1:
        return f"{text}, just now"
    return f"{text}, {span_words(delta)} ago" if delta > 0 else f"{text}, in {span_words(delta)}"


def time_element(value: str, now: str | datetime) -> Markup:
    """``<time datetime=ISO title=ISO>readable</time>``, escaped."""
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(
        value, readable_time(value, now)
    )


def with_readable_times(message: str, now: str | datetime) -> Markup:
    """``message`` escaped, each ISO time in it written as ``time_element`` does."""
    out = Markup()
    position = 0
    for match in ISO_TIME.finditer(message):
        if parse_time(match.group()) is None:
            continue  # looks like a time, is none (a month 13): left as text
        out += escape(message[position : match.start()]) + time_element(match.group(), now)
        position = match.end()
    return out + escape(message[position:])
