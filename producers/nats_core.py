"""The pure pieces of the NATS JetStream adapter: messages, settings, dispositions, in flight.

No I/O here, and no nats-py: a DAG file that declares a ``NatsJetStreamTrigger`` imports
this module, never the client (``producers.nats``, ``producers.nats_errors``).

``InFlightMessages`` keeps the deliveries fetched and not advanced yet, by reply subject
(one per delivery: a message redelivered while its first delivery is still held is a second
entry), in the order their ack wait was last restarted (fetched, or extended with
``in_progress``), so the next one due for an extension is always the first.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from producers.exceptions import ProducerConfigError, ProducerError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from shared_stream.producer import AdvanceOutcome

DEFAULT_SERVERS: Final = "nats://127.0.0.1:4222"
DEFAULT_ACK_WAIT_S: Final = 30.0
DEFAULT_MAX_DELIVER: Final = 5
DEFAULT_MAX_IN_FLIGHT: Final = 1000
MAX_FETCH_BATCH: Final = 256
FETCH_WAIT_S: Final = 0.5  # a pull request's life: what a closing producer waits at most
PULL_EXPIRY_MARGIN_S: Final = 0.2  # the server's clock of a pull request starts a bit later
CONNECT_TIMEOUT_S: Final = 5.0
API_TIMEOUT_S: Final = 5.0
CLOSE_TIMEOUT_S: Final = 5.0
MIN_ACK_WAIT_S: Final = 1.0
DeliverPolicy = Literal["all", "new", "last", "last_per_subject"]
DELIVER_POLICIES: Final[tuple[str, ...]] = get_args(DeliverPolicy)
OnReject = Literal["term", "nak"]
ON_REJECT_POLICIES: Final[tuple[str, ...]] = get_args(OnReject)
#: where JetStream announces a message that reached ``max_deliver`` (stream, consumer)
MAX_DELIVERIES_ADVISORY: Final = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"
#: headers a dead-lettered copy carries besides the original's
DEAD_LETTER_STREAM_HEADER: Final = "Sluice-Original-Stream"
DEAD_LETTER_SEQUENCE_HEADER: Final = "Sluice-Original-Sequence"
DEAD_LETTER_SUBJECT_HEADER: Final = "Sluice-Original-Subject"
DEAD_LETTER_CAUSE_HEADER: Final = "Sluice-Dead-Letter-Cause"
_NAME = re.compile(r"^[^.*>\s]+$")
_DURABLE = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class NatsConnection:
    """Where the servers are and how to authenticate (secrets are left out of ``repr``)."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """The servers as one text (the triggerer's warning for an unreachable broker)."""
        return ",".join(self.servers)

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"servers": list(self.servers)}
        if self.user is not None:
            kwargs["user"] = self.user
        if self.password is not None:
            kwargs["password"] = self.password
        if self.token is not None:
            kwargs["token"] = self.token
        return kwargs


@dataclass(frozen=True, slots=True)
class NatsMessage:
    """The raw event every subscriber gets (shared between them: do not mutate).

    ``sequence`` is the message's stream sequence (its identity in the stream);
    ``num_delivered`` counts this delivery (1 the first time); ``body`` is the JSON-decoded
    payload when it parses, else its text (undecodable bytes replaced).
    """

    stream: str
    sequence: int
    subject: str
    body: Any
    raw_body: bytes
    headers: dict[str, str]
    num_delivered: int
    published_at: str | None

    @property
    def dedup_key(self) -> str:
        return f"nats:{self.stream}:{self.sequence}"


@dataclass(frozen=True, slots=True)
class NatsReceipt:
    """The broker payload of one delivery: what ``advance`` needs to find it again."""

    reply: str
    sequence: int
    subject: str
    num_delivered: int


class Disposition(enum.Enum):
    """What ``advance`` does with one delivery."""

    ACK = "ack"
    NAK = "nak"
    DEAD_LETTER = "dead_letter"
    TERM = "term"


def disposition_of(
    outcome: AdvanceOutcome,
    *,
    num_delivered: int,
    max_deliver: int,
    dead_letter: bool,
    on_reject: OnReject = "term",
) -> Disposition:
    """Clean -> ack. Rejected with ``on_reject="term"`` -> dead letter (then term), or term
    without a dead-letter subject. Failed, no subscriber, or rejected with
    ``on_reject="nak"`` -> nak, redelivered now; but on its last delivery
    (``num_delivered == max_deliver``) JetStream would not redeliver it: dead letter it (or
    nak it, and JetStream emits its MAX_DELIVERIES advisory)."""
    if outcome.is_clean:
        return Disposition.ACK
    if outcome.rejected and on_reject == "term":
        return Disposition.DEAD_LETTER if dead_letter else Disposition.TERM
    if dead_letter and 0 < max_deliver <= num_delivered:
        return Disposition.DEAD_LETTER
    return Disposition.NAK


def decode_body(data: bytes) -> Any:
    """JSON when the payload parses as JSON, else its UTF-8 text (bad bytes replaced)."""
    text = data.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or (token != "*" and token != tokens[index]):
            return False
    return len(tokens) == len(wanted)


def check_settings(
    *,
    stream: str,
    durable: str,
    subjects: Sequence[str],
    create_stream: bool = False,
    stream_subjects: Sequence[str] = (),
    ack_wait_s: float = DEFAULT_ACK_WAIT_S,
    max_deliver: int = DEFAULT_MAX_DELIVER,
    dead_letter_subject: str | None = None,
    on_reject: str = "term",
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    deliver_policy: str = "all",
    where: str = "NATS JetStream producer",
) -> None:
    """Raise ``ProducerConfigError`` for settings that cannot work."""
    problems = []
    if on_reject not in ON_REJECT_POLICIES:
        problems.append(f"on_reject={on_reject!r} is not one of {list(ON_REJECT_POLICIES)}")
    if not _NAME.match(stream):
        problems.append(f"stream={stream!r} must be a name without '.', '*', '>' or spaces")
    if not _DURABLE.match(durable):
        problems.append(f"durable={durable!r} must use only letters, digits, '-' and '_'")
    if create_stream and not (stream_subjects or subjects):
        problems.append("create_stream=True needs stream_subjects (or subjects)")
    if ack_wait_s < MIN_ACK_WAIT_S:
        problems.append(f"ack_wait_s={ack_wait_s} must be at least {MIN_ACK_WAIT_S}")
    if max_deliver == 0 or max_deliver < -1:
        problems.append(f"max_deliver={max_deliver} must be at least 1 (or -1: unlimited)")
    if max_in_flight < 1:
        problems.append(f"max_in_flight={max_in_flight} must be at least 1")
    if deliver_policy not in DELIVER_POLICIES:
        problems.append(f"deliver_policy={deliver_policy!r} is not one of {list(DELIVER_POLICIES)}")
    if dead_letter_subject is not None:
        problems += _dead_letter_problems(dead_letter_subject, subjects)
    if problems:
        raise ProducerConfigError(f"{where}: " + "; ".join(problems))


def _dead_letter_problems(subject: str, subjects: Sequence[str]) -> list[str]:
    if not subject or any(c in subject for c in "*> "):
        return [f"dead_letter_subject={subject!r} must be a literal subject"]
    if any(subject_matches(s, subject) for s in subjects):
        return [
            f"dead_letter_subject={subject!r} is one of the consumer's subjects "
            f"{list(subjects)}: a dead-lettered message would come back to the watchers"
        ]
    return []


class InFlight:
    """One fetched delivery: the client's message (to ack), when its ack wait restarted."""

    __slots__ = ("extended_at", "message", "receipt")

    def __init__(self, receipt: NatsReceipt, message: Any, *, extended_at: float) -> None:
        self.receipt = receipt
        self.message = message
        self.extended_at = extended_at

    def __repr__(self) -> str:
        r = self.receipt
        return f"<InFlight seq={r.sequence} delivery={r.num_delivered} at={self.extended_at:.3f}>"


class InFlightMessages:
    """In-flight deliveries by reply subject, oldest ack-wait restart first."""

    def __init__(self) -> None:
        self._entries: dict[str, InFlight] = {}

    def add(self, entry: InFlight) -> None:
        self._entries[entry.receipt.reply] = entry

    def pop(self, reply: str) -> InFlight:
        """Take the delivery out (it is being advanced)."""
        entry = self._entries.pop(reply, None)
        if entry is None:
            raise ProducerError(
                f"NATS delivery {reply!r} is not in flight: it was advanced twice or never "
                "fetched by this producer"
            )
        return entry

    def next_due(self, every_s: float) -> float | None:
        """When the oldest restart is ``every_s`` old (None: nothing in flight)."""
        for entry in self._entries.values():
            return entry.extended_at + every_s
        return None

    def due(self, now: float, every_s: float) -> list[InFlight]:
        """Entries whose ack wait restarted ``every_s`` or more before ``now``."""
        due = []
        for entry in self._entries.values():
            if entry.extended_at + every_s > now:
                break
            due.append(entry)
        return due

    def extended(self, entries: Iterable[InFlight], now: float) -> None:
        """``entries`` had their ack wait restarted at ``now`` (advanced ones are ignored)."""
        for entry in entries:
            reply = entry.receipt.reply
            if self._entries.pop(reply, None) is None:
                continue
            entry.extended_at = now
            self._entries[reply] = entry

    def drain(self) -> list[InFlight]:
        """Take every entry out (the producer is closing)."""
        entries = list(self._entries.values())
        self._entries.clear()
        return entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<InFlightMessages {len(self._entries)}>"
