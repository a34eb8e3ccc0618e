"""The trigger contract: what a trigger is, what it yields, how it is stored.

A trigger is a small async object that waits for something outside and yields
``TriggerEvent``s. It is stored as ``serialize() -> (classpath, kwargs)`` and rebuilt by
``cls(**kwargs)``; ``__init__`` and ``serialize`` are a pair, so a rebuilt trigger compares
equal to the original. Names follow Apache Airflow's so that an Airflow trigger ports by
changing its imports.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Self

from triggers.serde import (
    PLAIN_SCALARS,
    TYPE_KEY,
    is_plain_json,
    payload_digest,
    serialize_value,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Mapping
    from datetime import timedelta

    from shared_stream.producer import SharedStreamProducer

logger = logging.getLogger(__name__)


#: The longest partition key an asset event or a DAG run stores (as Airflow's column).
MAX_PARTITION_KEY_LENGTH: Final = 250


def check_partition_key(key: object, where: str) -> str:
    """``key`` when it is a valid partition key (a non-empty string of at most
    ``MAX_PARTITION_KEY_LENGTH`` characters), else ``ValueError`` naming ``where`` and what
    is wrong. The one rule for every way a key comes in (a trigger's event, a task's
    outlets, ``sluice assets emit``, the REST API, a backfill's keys)."""
    if not isinstance(key, str):
        raise ValueError(f"{where}: a partition key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError(f"{where}: a partition key must not be empty")
    if len(key) > MAX_PARTITION_KEY_LENGTH:
        raise ValueError(
            f"{where}: partition key {key[:40]!r}... is {len(key)} characters long, more than "
            f"the {MAX_PARTITION_KEY_LENGTH} a partition key may have"
        )
    return key


def classpath_of(obj_or_cls: object) -> str:
    """The dotted import path of a class (or of an instance's class)."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}.{cls.__qualname__}"


class TriggerEvent:
    """Something a trigger fired, with a JSON-serializable (tagged) payload.

    Two events are equal when their payloads and partition keys are equal. ``dedup_key``
    names the *delivery* the event comes from (``kafka:<topic>:<partition>:<offset>``,
    ``sqs:<message id>``, a file's identity and mtime): the asset event a watcher's event
    becomes is stored once per key, so a redelivery of the same message is absorbed.
    Without a key (None, the default) every event is its own asset event, even with a
    payload equal to an earlier one's; see ``BaseEventTrigger.dedup_key`` for a trigger that
    wants equal payloads merged.

    ``partition_key`` is the slice of the asset the event updated (Airflow 3.3's partitioned
    asset events, e.g. an hour ``2026-03-10T09:00:00`` or a region ``us``, taken from a
    message field): the asset event a watcher's event becomes carries it, and a DAG
    scheduled on the asset by partition runs per key. None (the default) is an
    unpartitioned event. It is a string of at most ``MAX_PARTITION_KEY_LENGTH`` characters.

    The payload is checked as the event is built and must not be changed after: the engine
    relies on that check (``plain``: the payload is its own JSON form) when it stores it.
    """

    __slots__ = ("dedup_key", "partition_key", "payload", "plain")

    def __init__(
        self, payload: Any, *, dedup_key: str | None = None, partition_key: str | None = None
    ) -> None:
        self.partition_key = (
            None if partition_key is None else check_partition_key(partition_key, "TriggerEvent")
        )
        # Checked as it is built, so a payload that cannot be stored fails in the trigger's
        # own code, naming the event and the path inside it. The usual payload, a flat dict
        # of str keys and str/int/bool/None values, is checked inline (one event per
        # delivery of a shared stream: a call here is a measurable part of a fan-out);
        # any other goes through ``is_plain_json``, and what is not plain JSON is encoded,
        # which raises ``SerializationError`` for what cannot be stored.
        if type(payload) is dict and TYPE_KEY not in payload:
            for key, item in payload.items():
                if type(key) is not str or type(item) not in PLAIN_SCALARS:
                    break
            else:
                self.payload = payload
                self.dedup_key = dedup_key
                self.plain = True
                return
        plain = is_plain_json(payload)
        if not plain:
            serialize_value(payload, where=self._payload_name())
        self.payload = payload
        self.dedup_key = dedup_key
        self.plain = plain

    @classmethod
    def of_plain(
        cls, payload: Any, *, dedup_key: str | None = None, partition_key: str | None = None
    ) -> Self:
        """An event whose payload the caller knows to be plain JSON, built without the
        check: ``serde.is_plain_json(payload)`` holds (exact dicts with str keys and no
        reserved type key, lists, str, int, bool, None and finite floats, nested at most
        ``MAX_DEPTH``). For a producer that decoded the payload from JSON text and judged it
        as it did (``producers.kafka_codec``); anything else builds ``TriggerEvent(...)``.
        """
        event = cls.__new__(cls)
        event.payload = payload
        event.dedup_key = dedup_key
        event.partition_key = (
            None if partition_key is None else check_partition_key(partition_key, "TriggerEvent")
        )
        event.plain = True
        return event

    def _payload_name(self) -> str:
        return f"{type(self).__name__} payload"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TriggerEvent):
            return NotImplemented
        return (
            type(self) is type(other)
            and getattr(self, "partition_key", None) == getattr(other, "partition_key", None)
            and bool(self.payload == other.payload)
        )

    def __hash__(self) -> int:
        return hash((type(self), repr(self.payload)))

    def __repr__(self) -> str:
        partition = getattr(self, "partition_key", None)
        if partition is not None:
            return f"{type(self).__name__}<{self.payload!r} partition_key={partition!r}>"
        return f"{type(self).__name__}<{self.payload!r}>"


class BaseTaskEndEvent(TriggerEvent):
    """Ends the deferred task from the triggerer (``end_from_trigger``), no worker needed.

    ``xcoms`` are values the task publishes as it ends (kept with the task instance).
    """

    __slots__ = ("xcoms",)
    task_instance_state: str = ""

    def __init__(self, *, xcoms: dict[str, Any] | None = None) -> None:
        for name in xcoms or {}:
            if not isinstance(name, str):
                raise TypeError(f"{type(self).__name__} xcoms keys must be str, got {name!r}")
        super().__init__({"state": self.task_instance_state, "xcoms": dict(xcoms or {})})
        self.xcoms = dict(xcoms or {})


class TaskSuccessEvent(BaseTaskEndEvent):
    """Marks the task instance ``success``."""

    __slots__ = ()
    task_instance_state = "success"


class TaskFailedEvent(BaseTaskEndEvent):
    """Marks the task instance ``failed``."""

    __slots__ = ()
    task_instance_state = "failed"


class TaskSkippedEvent(BaseTaskEndEvent):
    """Marks the task instance ``skipped``."""

    __slots__ = ()
    task_instance_state = "skipped"


@dataclass(frozen=True, slots=True)
class StartTriggerArgs:
    """How to start a task straight on the triggerer (``start_from_trigger``)."""

    trigger_cls: str
    trigger_kwargs: dict[str, Any] = field(default_factory=dict)
    next_method: str = "execute_complete"
    next_kwargs: dict[str, Any] | None = None
    timeout: timedelta | None = None


class BaseTrigger(abc.ABC):
    """Base of every trigger.

    Subclasses implement ``serialize`` and ``run``; ``cleanup`` runs after ``run`` whatever
    happened (bounded in time by the runtime); ``on_kill`` runs only when a user asked to
    stop the trigger (not on a plain shutdown or a takeover by another triggerer).
    The runtime sets ``trigger_id`` before ``run`` starts.
    """

    # A slot, so that the slotted built-in triggers (``DateTimeTrigger``: a million may sit
    # idle in one triggerer) carry no ``__dict__``; a subclass without ``__slots__`` has one.
    __slots__ = ("_trigger_id",)

    #: Kwargs that name a connection (as Airflow's ``kafka_config_id``, ``aws_conn_id``).
    #: The triggerer looks up each one given (the environment's ``SLUICE_CONN_<ID>``, then
    #: the metadata database) and builds the trigger with the stored kwargs updated by
    #: ``connection_settings``: the stored row keeps only the id, never the secrets.
    connection_kwargs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **kwargs: Any) -> None:
        self._trigger_id: int | None = None

    @property
    def trigger_id(self) -> int | None:
        """The id of the trigger's row; the runtime sets it before ``run`` starts (None
        until then, also for a subclass whose ``__init__`` does not call ours)."""
        return getattr(self, "_trigger_id", None)

    @trigger_id.setter
    def trigger_id(self, value: int | None) -> None:
        self._trigger_id = value

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor kwargs the connection named by ``kwarg`` stands for.

        ``connection`` holds ``conn_id``, ``conn_type``, ``host``, ``port``, ``login``,
        ``password``, ``schema`` and ``extra`` (a dict). Raise ``ValueError`` for a
        connection that cannot configure this trigger (the message names what is wrong).
        """
        raise NotImplementedError(f"{cls.__qualname__} declares no connection kwargs")

    @abc.abstractmethod
    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return ``(classpath, kwargs)`` such that ``cls(**kwargs)`` rebuilds this trigger."""

    @abc.abstractmethod
    def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait, then yield one or more ``TriggerEvent``s (an async generator)."""

    async def cleanup(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release resources; called after ``run`` ends, is cancelled or raises."""

    def on_kill(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Called when a user asked to stop the trigger, before ``cleanup``."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BaseTrigger):
            return NotImplemented
        return self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash(self.serialize()[0])

    def __repr__(self) -> str:
        classpath, kwargs = self.serialize()
        # kwargs can hold secrets: show their names only.
        return f"<{classpath} trigger_id={self.trigger_id} kwargs={sorted(kwargs)}>"


class BaseEventTrigger(BaseTrigger):
    """Base of triggers usable by asset watchers.

    Shared streams (opt-in): sibling triggers whose ``shared_stream_key()`` compare equal
    share one upstream poll. ``open_shared_stream`` (fast mode) or
    ``create_shared_stream_producer`` (ack mode) is driven once per group with the kwargs
    of the group's first subscriber; each trigger's ``filter_shared_stream`` turns the raw
    stream into its own ``TriggerEvent``s.

    Deduplication recognises redeliveries, not equal payloads: give each event the key of
    the delivery it comes from (``TriggerEvent(payload, dedup_key=...)``), or override
    ``dedup_key()``. Set ``dedup_by_payload = True`` on a trigger whose equal payloads are
    the same fact (a poll that reports the same state again), to store them once.
    """

    #: Store events without a ``dedup_key`` once per distinct payload (keyed by the SHA-256
    #: of the payload's JSON) instead of once per event. Off by default: a sensor that
    #: sends ``{"status": "ok"}`` twice means it twice.
    dedup_by_payload: ClassVar[bool] = False

    def dedup_key(self, event: TriggerEvent) -> str | None:
        """The key the asset event made of ``event`` is stored once under, or None.

        The runtime calls it as the event is taken from the trigger, on the event loop: keep
        it cheap. The default returns ``event.dedup_key``; for an event without one, the
        payload digest when ``dedup_by_payload`` is set (with the event's partition key after
        it, when it has one: an equal payload of another slice is another fact), else None
        (never deduplicated). An override that derives the key from the event's broker
        coordinates is the other way. Keys are cut to 512 characters.
        """
        key = event.dedup_key
        if key is None and self.dedup_by_payload:
            digest = payload_digest(event.payload)
            partition = getattr(event, "partition_key", None)
            return digest if partition is None else f"{digest}|{partition}"
        return key

    def shared_stream_key(self) -> Hashable | None:
        """Key of the shared upstream; None (the default) runs this trigger's own ``run()``."""
        return None

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """Yield raw events from the shared upstream (fast mode), for the whole group."""
        raise NotImplementedError(
            f"{classpath_of(cls)} returns a shared_stream_key() but implements neither "
            "open_shared_stream() (fast mode) nor create_shared_stream_producer() (ack mode)"
        )
        yield  # pragma: no cover - makes this an async generator

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """Return the group's producer; overriding this selects ack mode."""
        raise NotImplementedError(
            f"{classpath_of(cls)} does not implement create_shared_stream_producer(); "
            "override it to use ack mode"
        )

    def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Consume the group's raw events and yield this trigger's ``TriggerEvent``s."""
        raise NotImplementedError(
            f"{classpath_of(self)} returns a shared_stream_key() but does not implement "
            "filter_shared_stream()"
        )

    @classmethod
    def uses_ack_mode(cls) -> bool:
        """True when ``create_shared_stream_producer`` is overridden below this base."""
        below = cls.__mro__[: cls.__mro__.index(BaseEventTrigger)]
        return any("create_shared_stream_producer" in klass.__dict__ for klass in below)
