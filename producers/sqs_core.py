"""The pure pieces of the SQS adapter: message types, settings, dispositions.

No I/O here, and no botocore: a DAG file that declares an ``SqsMessageTrigger`` imports this
module, never the client (``producers.sqs``, ``producers.sqs_errors``).

``InFlightMessages`` keeps the messages received and not advanced yet in the order they were
last made invisible (received, or extended by the heartbeat), so the next one due for an
extension is always the first: ``next_due`` is O(1) and ``due`` stops at the first entry
that is not due. An entry whose extension failed is *stale*: still in flight (its advance
will come) but no longer extended.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from producers.exceptions import ProducerConfigError, ProducerError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shared_stream.producer import AdvanceOutcome

OnReject = Literal["leave", "visible", "dead_letter"]
ON_REJECT_POLICIES: Final[tuple[str, ...]] = get_args(OnReject)
MAX_BATCH_ENTRIES: Final = 10
MAX_WAIT_TIME_S: Final = 20
MAX_VISIBILITY_TIMEOUT_S: Final = 43200
DEFAULT_MAX_IN_FLIGHT: Final = 1000
BATCH_ATTEMPTS: Final = 3
BATCH_RETRY_BACKOFF_S: Final = 0.2
CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_MARGIN_S: Final = 10.0
REQUEST_ATTEMPTS: Final = 3
CLOSE_TIMEOUT_S: Final = 5.0
# Visibility-change failures that only mean "already visible / already gone": nothing to do.
HARMLESS_VISIBILITY_CODES: Final = frozenset({"MessageNotInflight"})


@dataclass(frozen=True, slots=True)
class SqsConnection:
    """Where the queue is and how to authenticate (secrets are left out of ``repr``)."""

    queue_url: str
    region_name: str | None = None
    endpoint_url: str | None = None
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)

    def client_kwargs(self) -> dict[str, Any]:
        return {
            "region_name": self.region_name,
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.aws_access_key_id,
            "aws_secret_access_key": self.aws_secret_access_key,
            "aws_session_token": self.aws_session_token,
        }


@dataclass(frozen=True, slots=True)
class SqsMessage:
    """The raw event every subscriber gets (shared between them: do not mutate).

    ``body`` is the JSON-decoded body when it parses, else the text; ``message_attributes``
    maps each name to its string (String / Number types) or bytes (Binary) value.
    """

    message_id: str
    body: Any
    raw_body: str
    attributes: dict[str, str]
    message_attributes: dict[str, Any]
    group_id: str | None


@dataclass(frozen=True, slots=True)
class SqsReceipt:
    """The broker payload of one received message: what ``advance`` needs."""

    receipt_handle: str
    message_id: str
    group_id: str | None


class Disposition(enum.Enum):
    """What ``advance`` does with one message."""

    DELETE = "delete"
    MAKE_VISIBLE = "make_visible"
    DEAD_LETTER = "dead_letter"
    LEAVE = "leave"


def disposition_of(outcome: AdvanceOutcome, on_reject: OnReject) -> Disposition:
    """Clean -> delete; any reject -> the policy; failed or zero-subscriber -> visible now."""
    if outcome.is_clean:
        return Disposition.DELETE
    if outcome.rejected:
        return {
            "leave": Disposition.LEAVE,
            "visible": Disposition.MAKE_VISIBLE,
            "dead_letter": Disposition.DEAD_LETTER,
        }[on_reject]
    return Disposition.MAKE_VISIBLE


def _message_attributes(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        name: value.get("StringValue", value.get("BinaryValue"))
        for name, value in raw.get("MessageAttributes", {}).items()
    }


def _decode_body(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_message(raw: dict[str, Any]) -> tuple[SqsMessage, SqsReceipt]:
    """The raw event and broker payload of one ``ReceiveMessage`` entry."""
    attributes: dict[str, str] = raw.get("Attributes", {})
    group_id = attributes.get("MessageGroupId")
    receipt = SqsReceipt(raw["ReceiptHandle"], raw["MessageId"], group_id)
    message = SqsMessage(
        message_id=raw["MessageId"],
        body=_decode_body(raw["Body"]),
        raw_body=raw["Body"],
        attributes=attributes,
        message_attributes=_message_attributes(raw),
        group_id=group_id,
    )
    return message, receipt


def check_settings(
    *,
    on_reject: str = "leave",
    dead_letter_queue_url: str | None = None,
    visibility_timeout_s: int | None = None,
    wait_time_s: int = MAX_WAIT_TIME_S,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    where: str = "SQS producer",
) -> None:
    """Raise ``ProducerConfigError`` for settings that cannot work."""
    problems = []
    if on_reject not in ON_REJECT_POLICIES:
        problems.append(f"on_reject={on_reject!r} is not one of {list(ON_REJECT_POLICIES)}")
    if on_reject == "dead_letter" and not dead_letter_queue_url:
        problems.append('on_reject="dead_letter" needs dead_letter_queue_url')
    if (
        visibility_timeout_s is not None
        and not 1 <= visibility_timeout_s <= MAX_VISIBILITY_TIMEOUT_S
    ):
        problems.append(
            f"a visibility timeout of {visibility_timeout_s}s cannot keep messages invisible "
            f"while subscribers work (1 to {MAX_VISIBILITY_TIMEOUT_S}s; set visibility_timeout_s)"
        )
    if not 1 <= wait_time_s <= MAX_WAIT_TIME_S:  # 0 would poll an empty queue in a busy loop
        problems.append(f"wait_time_s={wait_time_s} must be within 1..{MAX_WAIT_TIME_S}")
    if max_in_flight < 1:
        problems.append(f"max_in_flight={max_in_flight} must be at least 1")
    if problems:
        raise ProducerConfigError(f"{where}: " + "; ".join(problems))


class InFlight:
    """One received message: its receipt, what a dead-letter copy needs, when last extended."""

    __slots__ = ("body", "extended_at", "message_attributes", "receipt")

    def __init__(
        self,
        receipt: SqsReceipt,
        body: str,
        message_attributes: dict[str, Any],
        *,
        extended_at: float,
    ) -> None:
        self.receipt = receipt
        self.body = body
        self.message_attributes = message_attributes
        self.extended_at = extended_at

    def __repr__(self) -> str:
        return f"<InFlight {self.receipt.message_id} extended_at={self.extended_at:.3f}>"


class InFlightMessages:
    """In-flight messages by receipt handle, oldest extension first."""

    def __init__(self) -> None:
        self._extending: dict[str, InFlight] = {}
        self._stale: dict[str, InFlight] = {}

    def add(self, entry: InFlight) -> None:
        self._extending[entry.receipt.receipt_handle] = entry

    def pop(self, receipt_handle: str) -> InFlight:
        """Take the message out (it is being advanced)."""
        entry = self._extending.pop(receipt_handle, None) or self._stale.pop(receipt_handle, None)
        if entry is None:
            raise ProducerError(
                f"SQS receipt handle {receipt_handle[:16]}... is not in flight: it was "
                "advanced twice or never received by this producer"
            )
        return entry

    def next_due(self, every_s: float) -> float | None:
        """When the oldest extension is ``every_s`` old (None: nothing to extend)."""
        for entry in self._extending.values():
            return entry.extended_at + every_s
        return None

    def due(self, now: float, every_s: float) -> list[InFlight]:
        """Entries last made invisible ``every_s`` or more before ``now``."""
        due = []
        for entry in self._extending.values():
            if entry.extended_at + every_s > now:
                break
            due.append(entry)
        return due

    def extended(
        self, entries: Iterable[InFlight], now: float, *, stale: Iterable[InFlight]
    ) -> None:
        """``entries`` were made invisible at ``now``, except ``stale`` (no more extensions).

        Entries advanced meanwhile (no longer here) are ignored.
        """
        failed = {id(entry) for entry in stale}
        for entry in entries:
            handle = entry.receipt.receipt_handle
            if self._extending.pop(handle, None) is None:
                continue
            if id(entry) in failed:
                self._stale[handle] = entry
            else:
                entry.extended_at = now
                self._extending[handle] = entry

    def drain(self) -> list[InFlight]:
        """Take every entry out (the producer is closing)."""
        entries = [*self._extending.values(), *self._stale.values()]
        self._extending.clear()
        self._stale.clear()
        return entries

    def __len__(self) -> int:
        return len(self._extending) + len(self._stale)

    def __repr__(self) -> str:
        return f"<InFlightMessages extending={len(self._extending)} stale={len(self._stale)}>"
