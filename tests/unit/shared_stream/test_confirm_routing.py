"""``confirm_persisted`` routes each seq to its group and dispatches once per group."""

from __future__ import annotations

from typing import Any

import anyio

from shared_stream import SharedStreamManager
from shared_stream.testing import InMemoryProducer, SubscriberHarness
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of


class SourceTrigger(BaseEventTrigger):
    producers: dict[str, InMemoryProducer] = {}  # noqa: RUF012 - a test registry

    def __init__(self, *, source: str) -> None:
        super().__init__()
        self.source = source

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"source": self.source}

    async def run(self) -> Any:
        yield TriggerEvent({})

    def shared_stream_key(self) -> Any:
        return ("confirm-routing", self.source)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> InMemoryProducer:
        return cls.producers[kwargs["source"]]

    async def filter_shared_stream(self, shared_stream: Any) -> Any:
        async for raw in shared_stream:
            yield TriggerEvent(raw)


async def test_interleaved_seqs_of_two_groups_advance_as_one_batch_each():
    with anyio.fail_after(5):
        a = SourceTrigger.producers["a"] = InMemoryProducer()
        b = SourceTrigger.producers["b"] = InMemoryProducer()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harnesses = {}
            for tid, source in ((1, "a"), (2, "b")):
                harness = SubscriberHarness(
                    mgr, SourceTrigger(source=source), trigger_id=tid, auto_confirm=False
                )
                harnesses[source] = harness
                tg.start_soon(harness.run)
            for n in range(3):
                await a.put({"n": n}, f"a{n}")
                await b.put({"n": n}, f"b{n}")
            for harness in harnesses.values():
                await harness.wait_for_events(3)
            await anyio.wait_all_tasks_blocked()  # both moved past their third event
            assert a.attempted_batches == b.attempted_batches == []
            interleaved = [
                seq
                for pair in zip(harnesses["a"].unconfirmed, harnesses["b"].unconfirmed, strict=True)
                for seq in pair
            ]
            mgr.confirm_persisted([*interleaved, 12345, interleaved[0]])  # unknown, repeated
            await a.wait_for_advanced(3)
            await b.wait_for_advanced(3)
            assert [[p for p, _ in batch] for batch in a.batches] == [["a0", "a1", "a2"]]
            assert [[p for p, _ in batch] for batch in b.batches] == [["b0", "b1", "b2"]]
            assert mgr.pending_confirmations == 0
            tg.cancel_scope.cancel()
