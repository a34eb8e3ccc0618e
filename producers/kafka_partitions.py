"""Which Kafka partitions a producer owns, and what it yielded on them: pure bookkeeping.

Each assignment of a partition to this consumer is an *epoch* (counted up on every
assignment). Every raw event yielded (a message, or a ``KafkaMessageBatch`` of consecutive
messages) is remembered with its epoch until its advance; the shared-stream manager
advances each partition (lane) in yield order, so an advance batch is always the oldest
remembered raw events of its partition; ``inflight`` counts messages, not raw events. A
message may be committed only while its epoch is the partition's current one and the
partition is owned; a commit never moves the offset back. No I/O, no clock:
``KafkaSharedStreamProducer`` drives it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from producers.kafka_messages import KafkaMessageBatch

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from producers.kafka_messages import KafkaMessage
    from shared_stream.producer import AdvanceItem

PartitionKey = tuple[str, int]


class _Partition:
    __slots__ = ("advancing", "committed_to", "epoch", "inflight", "owned", "revoking")

    def __init__(self) -> None:
        self.epoch = 0
        self.owned = False
        self.revoking = False
        self.advancing = 0  # advances of this partition running now
        self.committed_to = -1  # offset last committed in this epoch (the next one to read)
        # (epoch, raw event) yielded, not advanced yet
        self.inflight: deque[tuple[int, KafkaMessage | KafkaMessageBatch]] = deque()

    def __repr__(self) -> str:
        return (
            f"<_Partition epoch={self.epoch} owned={self.owned} revoking={self.revoking} "
            f"advancing={self.advancing} inflight={len(self.inflight)} "
            f"committed_to={self.committed_to}>"
        )


class PartitionBook:
    """Epochs, ownership and in-flight messages of every partition a producer has seen."""

    def __init__(self) -> None:
        self._partitions: dict[PartitionKey, _Partition] = {}
        self._inflight = 0  # messages yielded and not advanced yet, every partition
        self.dropped = 0  # messages advanced after their epoch ended (not committable)

    # -- rebalances -----------------------------------------------------------------------

    def assign(self, keys: Iterable[PartitionKey]) -> None:
        """The partitions are (re)assigned to us: a new epoch for each."""
        for key in keys:
            state = self._partitions.get(key)
            if state is None:
                state = self._partitions[key] = _Partition()
            state.epoch += 1
            state.owned, state.revoking, state.committed_to = True, False, -1

    def begin_revoke(self, keys: Iterable[PartitionKey]) -> list[PartitionKey]:
        """Stop yielding on these partitions (still owned: their drain may commit)."""
        known = [key for key in keys if key in self._partitions]
        for key in known:
            self._partitions[key].revoking = True
        return known

    def is_drained(self, keys: Iterable[PartitionKey]) -> bool:
        """True when everything yielded on these partitions was advanced."""
        return all(not (s := self._partitions[key]).inflight and not s.advancing for key in keys)

    def end_revoke(self, keys: Iterable[PartitionKey]) -> int:
        """The partitions are gone; returns how many yielded messages were left unadvanced."""
        left = 0
        for key in keys:
            state = self._partitions[key]
            state.owned = state.revoking = False
            left += sum(
                len(raw) if type(raw) is KafkaMessageBatch else 1 for _, raw in state.inflight
            )
        return left

    # -- yielding -------------------------------------------------------------------------

    def yielding_epoch(self, key: PartitionKey) -> int | None:
        """The epoch to yield the partition's fetched records in; None: do not yield them."""
        state = self._partitions.get(key)
        if state is None or not state.owned or state.revoking:
            return None
        return state.epoch

    def record(self, key: PartitionKey, epoch: int, raw: KafkaMessage | KafkaMessageBatch) -> bool:
        """Remember a raw event about to be yielded; False when ``epoch`` no longer owns it."""
        state = self._partitions[key]
        if state.epoch != epoch or not state.owned or state.revoking:
            return False
        state.inflight.append((epoch, raw))
        self._inflight += len(raw) if type(raw) is KafkaMessageBatch else 1
        return True

    # -- advancing ------------------------------------------------------------------------

    def begin_advance(
        self, key: PartitionKey, batch: Sequence[AdvanceItem]
    ) -> list[tuple[AdvanceItem, KafkaMessage | KafkaMessageBatch]]:
        """Forget the batch's raw events; returns those still committable (current epoch).

        Call ``end_advance(key)`` when the advance is over, whatever happened.
        """
        state = self._partitions[key]
        state.advancing += 1
        live: list[tuple[AdvanceItem, KafkaMessage | KafkaMessageBatch]] = []
        for item in batch:
            epoch, raw = state.inflight.popleft()
            if isinstance(raw, KafkaMessageBatch):
                offset = raw.last_offset
                self._inflight -= len(raw)
            else:
                offset = raw.offset
                self._inflight -= 1
            if offset != item.broker_payload[2]:
                raise RuntimeError(
                    f"advance of {item.broker_payload} does not match the next raw event "
                    f"yielded on {key[0]}/{key[1]} (last offset {offset})"
                )
            if epoch == state.epoch and state.owned:
                live.append((item, raw))
            else:
                self.dropped += len(raw) if type(raw) is KafkaMessageBatch else 1
        return live

    def end_advance(self, key: PartitionKey) -> None:
        self._partitions[key].advancing -= 1

    def may_commit(self, key: PartitionKey, offset: int) -> bool:
        """True when committing ``offset`` would move an owned partition forward."""
        state = self._partitions[key]
        return state.owned and offset > state.committed_to

    def committed(self, key: PartitionKey, offset: int) -> None:
        state = self._partitions[key]
        state.committed_to = max(state.committed_to, offset)

    # -- questions ------------------------------------------------------------------------

    @property
    def owned(self) -> list[PartitionKey]:
        return sorted(key for key, state in self._partitions.items() if state.owned)

    @property
    def inflight(self) -> int:
        """Messages yielded and not advanced yet (a batch counts its messages)."""
        return self._inflight

    def __repr__(self) -> str:
        return f"<PartitionBook owned={self.owned} inflight={self.inflight}>"
