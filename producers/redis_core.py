"""The pure pieces of the Redis Streams adapter: entries, settings, dispositions, bookkeeping.

No I/O here, and no ``redis`` import: a DAG file that declares a ``RedisStreamTrigger``
imports this module, never the client (``producers.redis``, ``producers.redis_errors``).

``InFlightEntries`` keeps the entries read and not advanced yet, in the order they were last
*touched* (read, claimed, or re-claimed by the heartbeat that keeps their idle time low), so
the next one due for a touch is always the first: ``due`` stops at the first entry that is
not due. ``read_plan`` splits the free in-flight capacity over the streams so that one
``XREADGROUP`` (whose ``COUNT`` applies per stream) never returns more than the capacity.
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, get_args
from urllib.parse import quote, urlsplit

from producers.exceptions import ProducerConfigError, ProducerError
from producers.in_flight import InFlightLedger

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from shared_stream.producer import AdvanceOutcome

OnReject = Literal["dead_letter", "leave"]
ON_REJECT_POLICIES: Final[tuple[str, ...]] = get_args(OnReject)
DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_BODY_FIELD: Final = "body"
DEFAULT_MAX_IN_FLIGHT: Final = 1000
#: entries one read (XREADGROUP, XAUTOCLAIM) asks for at most, whatever the free capacity
READ_ENTRIES: Final = 200
DEFAULT_BLOCK_MS: Final = 5000
DEFAULT_CLAIM_IDLE_MS: Final = 30_000
DEFAULT_MAX_DELIVERIES: Final = 10
DEAD_LETTER_SUFFIX: Final = ":dead"
CONNECT_TIMEOUT_S: Final = 5.0
# A blocked XREADGROUP answers after its BLOCK time: the socket waits that long plus this.
SOCKET_TIMEOUT_MARGIN_S: Final = 10.0
CLOSE_TIMEOUT_S: Final = 5.0
# Fields a dead-lettered copy carries besides the entry's own.
ORIGINAL_STREAM_FIELD: Final = "sluice.original_stream"
ORIGINAL_ID_FIELD: Final = "sluice.original_id"
REASON_FIELD: Final = "sluice.reason"
URL_SCHEMES: Final = ("redis", "rediss", "unix")


@dataclass(frozen=True, slots=True)
class RedisEndpoint:
    """Where the server is: a ``redis://`` URL (its password is left out of ``repr``)."""

    url: str = field(repr=False)

    @property
    def address(self) -> str:
        """The URL without credentials: for logs, errors and the shared-stream key."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"RedisEndpoint({self.address!r})"


def redact_url(url: str) -> str:
    """``url`` without its user name and password (``redis://host:port/db``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path}"


def url_from_connection(connection: Mapping[str, Any]) -> str:
    """A ``redis`` connection (host, port, login, password; the database in ``schema`` or the
    extra's ``db``; ``rediss`` or the extra's ``ssl`` for TLS) as a client URL."""
    extra = dict(connection.get("extra") or {})
    host = connection.get("host") or "127.0.0.1"
    port = connection.get("port") or 6379
    schema = str(connection.get("schema") or "").strip("/")
    db = extra.get("db", schema if schema.isdigit() else 0)
    tls = connection.get("conn_type") == "rediss" or str(extra.get("ssl", "")).lower() in (
        "1",
        "true",
        "yes",
    )
    login = connection.get("login") or ""
    password = connection.get("password") or ""
    credentials = ""
    if login or password:
        credentials = quote(str(login), safe="")
        if password:
            credentials += ":" + quote(str(password), safe="")
        credentials += "@"
    netloc = f"[{host}]" if ":" in str(host) else str(host)
    return f"{'rediss' if tls else 'redis'}://{credentials}{netloc}:{int(port)}/{int(db)}"


@dataclass(frozen=True, slots=True)
class RedisEntry:
    """The raw event every subscriber gets (shared between them: do not mutate).

    ``fields``: the entry's fields, each value text when it is UTF-8, else
    ``{"base64": ...}``. ``body``: the ``body_field`` value, JSON-decoded when it parses
    (``body_format`` says which: ``json``, ``text``, ``base64`` when it is not UTF-8, or
    ``missing`` (``body`` None) when the entry has no such field). ``delivery_count``: how
    many times the group delivered it (1 the first time).
    """

    stream: str
    entry_id: str
    fields: dict[str, Any]
    body: Any
    body_format: str
    delivery_count: int


@dataclass(frozen=True, slots=True)
class RedisEntryRef:
    """The broker payload of one entry: what ``advance`` needs."""

    stream: str
    entry_id: str


class Disposition(enum.Enum):
    """What ``advance`` does with one entry."""

    ACK = "ack"
    DEAD_LETTER = "dead_letter"
    REDELIVER = "redeliver"
    LEAVE = "leave"


def disposition_of(outcome: AdvanceOutcome, on_reject: OnReject = "dead_letter") -> Disposition:
    """Clean -> XACK; any reject -> dead stream + XACK (or ``leave`` it pending, for the next
    claim); failed or no subscriber -> read again at once."""
    if outcome.is_clean:
        return Disposition.ACK
    if outcome.rejected:
        return Disposition.DEAD_LETTER if on_reject == "dead_letter" else Disposition.LEAVE
    return Disposition.REDELIVER


def text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "backslashreplace")


def field_value(value: bytes) -> Any:
    """A field's value as text when it is UTF-8, else ``{"base64": ...}`` (JSON-safe)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode("ascii")}


def decode_body(value: Any) -> tuple[Any, str]:
    """A field's value (``field_value``) as the body and its format."""
    if value is None:
        return None, "missing"
    if not isinstance(value, str):
        return value, "base64"
    try:
        return json.loads(value), "json"
    except ValueError:
        return value, "text"


def make_entry(
    stream: str, entry_id: str, raw: Mapping[bytes, bytes], body_field: str, delivery_count: int
) -> RedisEntry:
    fields = {text(name): field_value(value) for name, value in raw.items()}
    body, body_format = decode_body(fields.get(body_field))
    return RedisEntry(stream, entry_id, fields, body, body_format, delivery_count)


def dead_letter_fields(
    raw: Mapping[bytes, bytes], stream: str, entry_id: str, reason: str
) -> dict[bytes | str, bytes | str]:
    """What the dead stream's copy of an entry holds: its fields, then where it came from."""
    copy = dict[bytes | str, bytes | str](raw.items())
    copy[ORIGINAL_STREAM_FIELD] = stream
    copy[ORIGINAL_ID_FIELD] = entry_id
    copy[REASON_FIELD] = reason
    return copy


def check_settings(
    *,
    streams: Sequence[str],
    group: str,
    url: str | None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    block_ms: int = DEFAULT_BLOCK_MS,
    claim_idle_ms: int | None = DEFAULT_CLAIM_IDLE_MS,
    max_deliveries: int | None = DEFAULT_MAX_DELIVERIES,
    start_id: str = "0",
    on_reject: str = "dead_letter",
    where: str = "Redis stream producer",
) -> None:
    """Raise ``ProducerConfigError`` for settings that cannot work."""
    problems = []
    if on_reject not in ON_REJECT_POLICIES:
        problems.append(f"on_reject={on_reject!r} is not one of {list(ON_REJECT_POLICIES)}")
    if not streams or not all(isinstance(s, str) and s for s in streams):
        problems.append(f"streams must be stream names, got {list(streams)!r}")
    if not isinstance(group, str) or not group:
        problems.append(f"group must be a consumer group name, got {group!r}")
    if url is not None and urlsplit(url).scheme not in URL_SCHEMES:
        problems.append(
            f"url must start with one of {[s + '://' for s in URL_SCHEMES]}, got "
            f"{redact_url(url)!r}"
        )
    if max_in_flight < 1:
        problems.append(f"max_in_flight={max_in_flight} must be at least 1")
    if block_ms < 1:  # BLOCK 0 would wait forever, deaf to cancellation of its socket read
        problems.append(f"block_ms={block_ms} must be at least 1")
    if claim_idle_ms is not None and claim_idle_ms < 100:
        problems.append(
            f"claim_idle_ms={claim_idle_ms} must be at least 100 (or None: never claim the "
            "pending entries of other consumers)"
        )
    if max_deliveries is not None and max_deliveries < 1:
        problems.append(f"max_deliveries={max_deliveries} must be at least 1 (or None)")
    if start_id != "$" and not _is_entry_id(start_id):
        problems.append(f"start_id={start_id!r} must be '$', '0' or an entry id like '1-0'")
    if problems:
        raise ProducerConfigError(f"{where}: " + "; ".join(problems))


def _is_entry_id(value: str) -> bool:
    ms, _, seq = value.partition("-")
    return ms.isdigit() and (not seq or seq.isdigit())


def read_plan(streams: Sequence[str], capacity: int, turn: int) -> tuple[list[str], int]:
    """The streams one ``XREADGROUP`` reads and its ``COUNT`` (per stream), so that at most
    ``capacity`` entries come back; ``turn`` rotates which streams go first when the
    capacity is smaller than their number."""
    if capacity >= len(streams):
        return list(streams), capacity // len(streams)
    start = turn % len(streams)
    rotated = [*streams[start:], *streams[:start]]
    return rotated[:capacity], 1


class InFlight:
    """One entry read and not advanced: its raw fields (for a dead-letter copy), its
    delivery count, when it was last touched (its idle time reset)."""

    __slots__ = ("delivery_count", "entry_id", "raw_fields", "stream", "touched_at")

    def __init__(
        self,
        stream: str,
        entry_id: str,
        raw_fields: Mapping[bytes, bytes],
        delivery_count: int,
        *,
        touched_at: float,
    ) -> None:
        self.stream = stream
        self.entry_id = entry_id
        self.raw_fields = raw_fields
        self.delivery_count = delivery_count
        self.touched_at = touched_at

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.entry_id)

    def __repr__(self) -> str:
        return (
            f"<InFlight {self.stream}:{self.entry_id} deliveries={self.delivery_count} "
            f"touched_at={self.touched_at:.3f}>"
        )


class InFlightEntries(InFlightLedger[tuple[str, str], InFlight]):
    """In-flight entries by ``(stream, entry id)``, least recently touched first."""

    def _key_of(self, entry: InFlight) -> tuple[str, str]:
        return entry.key

    def _restarted_at(self, entry: InFlight) -> float:
        return entry.touched_at

    def _set_restarted_at(self, entry: InFlight, now: float) -> None:
        entry.touched_at = now

    def pop(self, stream: str, entry_id: str) -> InFlight:
        """Take the entry out (it is being advanced)."""
        entry = self._take((stream, entry_id))
        if entry is None:
            raise ProducerError(
                f"Redis entry {entry_id} of stream {stream!r} is not in flight: it was "
                "advanced twice or never read by this producer"
            )
        return entry

    def touched(self, entries: Iterable[InFlight], now: float) -> None:
        """``entries`` had their idle time reset at ``now``; those advanced meanwhile are
        ignored."""
        self.restarted(entries, now)

    def __repr__(self) -> str:
        return f"<InFlightEntries held={len(self)}>"
