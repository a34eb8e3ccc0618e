"""``AckModeMessageTrigger``: what the broker triggers of one shared queue have in common.

A subclass (SQS, RabbitMQ, Redis Streams, NATS JetStream, MQTT) owns its arguments, its
``serialize()``, its key and producer, and says how to judge one message of its broker:
``matches`` (its filters; may be async; may raise to reject), ``_partition_key`` (from the
sources its broker offers), ``_dedup_key`` and ``event_payload``. This base owns the
``filter_shared_stream`` loop every one of them runs:

1. the filters, then ``apply_function`` where the trigger has one: a filter that raises
   rejects the message (``Rejected`` says why, or "its filter raised ...");
2. a rejected message is logged (``_log_rejected``, action ``<broker>.message_rejected``)
   and refused (``reject_shared_stream_event()``): the producer applies its ``on_reject``;
3. an accepted message gets its partition key (``partition_key_rule``; none valid:
   rejected) and fires one ``TriggerEvent`` with its dedup key.

``run()`` refuses: these triggers settle a message (ack, delete) only once its asset events
are stored, which only the shared stream's ack mode does.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from producers.message_filters import Rejected, apply, load_apply_function
from producers.partition_keys import NoKey, load_key_function, rejection
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerContractError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from producers.partition_keys import PartitionKeyRule

logger = logging.getLogger(__name__)

MessageT = TypeVar("MessageT")


class AckModeMessageTrigger(BaseEventTrigger, Generic[MessageT]):
    """Base of the ack-mode broker triggers: filter, reject, key and fire each message."""

    #: what the producer does with a message once its events are stored (``run()``'s refusal)
    settled_as: ClassVar[str] = "messages are acked"
    #: the ``action`` of the rejection log record
    rejected_action: ClassVar[str]
    #: said after the reason in the rejection log line
    rejected_note: ClassVar[str] = ""

    #: dotted path of ``f(message, *apply_function_args, **apply_function_kwargs)``
    apply_function: str | None = None
    apply_function_args: list[Any]
    apply_function_kwargs: dict[str, Any]
    partition_key_rule: PartitionKeyRule | None

    def __init__(self) -> None:
        super().__init__()
        self.partition_key_rule = None
        self._key_function: Callable[[Any], Any] | None = None
        self._function: Callable[..., Any] | None = None

    # -- what a subclass says about its broker's messages ---------------------------------

    def matches(self, message: MessageT) -> bool | Awaitable[bool]:
        """True when ``message`` passes this trigger's filters; may raise to reject it."""
        raise NotImplementedError

    def _partition_key(self, message: MessageT, rule: PartitionKeyRule) -> str:
        """The event's partition key under ``rule``; ``NoKey`` when it gives none."""
        raise NotImplementedError

    def _dedup_key(self, message: MessageT) -> str | None:
        """The key a redelivery of ``message`` is recognised by; ``Rejected`` when none."""
        raise NotImplementedError

    def event_payload(self, message: MessageT) -> dict[str, Any]:
        raise NotImplementedError

    def _rejected_what(self, message: Any) -> tuple[str, dict[str, Any]]:
        """How the rejection log names ``message``, and its identity fields (``extra``)."""
        raise NotImplementedError

    # -- the loop -------------------------------------------------------------------------

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        self._load_functions()
        accepted, event_of = self._accepted, self._event
        async for message in shared_stream:
            # No coroutine per message unless a filter is async: every watcher of the
            # stream judges every message.
            try:
                verdict = accepted(message)
                if verdict is not True and inspect.isawaitable(verdict):
                    verdict = await verdict
            except Exception as exc:  # noqa: BLE001 - a filter that raises rejects the message
                self._reject(message, exc)
                continue
            if not verdict:
                continue
            try:
                event = event_of(message)
            except Rejected as why:
                self._reject(message, why)
                continue
            yield event

    def _accepted(self, message: MessageT) -> bool | Awaitable[bool]:
        """``matches``; a subclass adds ``apply_function`` here or inside ``matches``."""
        return self.matches(message)

    def _event(self, message: MessageT) -> TriggerEvent:
        """The event of an accepted message; ``Rejected`` when it gives no valid key."""
        key = None
        if (rule := self.partition_key_rule) is not None:
            try:
                key = self._partition_key(message, rule)
            except NoKey as problem:
                raise Rejected(self._key_rejection(rule, problem)) from None
        return TriggerEvent(
            self.event_payload(message), dedup_key=self._dedup_key(message), partition_key=key
        )

    def _reject(self, message: Any, exc: Exception) -> None:
        """Log why ``message`` is refused and refuse it (the producer's ``on_reject``)."""
        from shared_stream.subscriber import reject_shared_stream_event  # where it runs

        reason = str(exc) if isinstance(exc, Rejected) else f"its filter raised {exc!r}"
        self._log_rejected(message, reason)
        reject_shared_stream_event()

    async def _function_accepts(self, message: MessageT) -> bool:
        """``apply_function``'s verdict on ``message`` (True without one)."""
        if self._function is None:
            return True
        verdict = await apply(
            self._function, message, self.apply_function_args, self.apply_function_kwargs
        )
        return bool(verdict)

    def _key_rejection(self, rule: PartitionKeyRule, problem: NoKey) -> str:
        return rejection(rule, problem)

    def _load_functions(self) -> None:
        """Import the ``partition_key_function`` and ``apply_function`` (once, where the
        trigger runs)."""
        rule = self.partition_key_rule
        if rule is not None and rule.source == "function" and self._key_function is None:
            self._key_function = load_key_function(rule, self.trigger_id)
        if self.apply_function is not None and self._function is None:
            self._function = load_apply_function(self.apply_function, self.trigger_id)

    def _log_rejected(self, message: Any, reason: str) -> None:
        what, identity = self._rejected_what(message)
        logger.warning(
            "%s %s rejected %s: %s%s",
            type(self).__name__,
            self.trigger_id,
            what,
            reason,
            self.rejected_note,
            extra={"action": self.rejected_action, "trigger_id": self.trigger_id, **identity},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise TriggerContractError(
            f"{classpath_of(self)} runs only as a shared-stream subscriber (ack mode): its "
            f"{self.settled_as} once their asset events are stored, which run() cannot do"
        )
        yield  # pragma: no cover - makes this an async generator
