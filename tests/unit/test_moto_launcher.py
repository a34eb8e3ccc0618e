"""The test SQS server's patches: what the conformance kit's gate reads must be true.

``SqsKitStream.unresolved()`` sums three counts of one ``GetQueueAttributes``; stock moto
judges each message's visibility afresh for every count (and for every attribute asked), so
a batch whose visibility timeout ends mid-request was in none of them and the gate saw it
as gone from the queue. Here the server's clock moves on at every reading, as a busy
machine's does between two counts: each request must still count every message once.
"""

from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING

from tests import moto_launcher

if TYPE_CHECKING:
    import pytest

ATTRIBUTES = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]


def test_a_request_counts_every_message_once_while_their_visibility_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID

    moto_launcher.patch()
    ticks = itertools.count()
    # 1 ms later at every reading: one request reads it hundreds of times
    monkeypatch.setattr(moto_launcher, "wall_clock", lambda: 1_000_000.0 + next(ticks) * 0.001)
    backend = moto_launcher.models.sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    name = f"launcher-{uuid.uuid4().hex}"
    backend.create_queue(name)
    try:
        for n in range(10):
            backend.send_message(name, f"m{n}")
        got = backend.receive_message(name, count=10, wait_seconds_timeout=0, visibility_timeout=1)
        assert len(got) == 10
        seen = []
        for _ in range(5000):  # until the visibility timeout has ended for all of them
            counts = backend.get_queue_attributes(name, ATTRIBUTES)
            seen.append({k: int(v) for k, v in counts.items()})
            if int(counts["ApproximateNumberOfMessages"]) == 10:
                break
        assert seen[-1]["ApproximateNumberOfMessages"] == 10, seen
        assert any(c["ApproximateNumberOfMessagesNotVisible"] == 10 for c in seen), seen
        assert all(sum(c.values()) == 10 for c in seen), seen
    finally:
        backend.delete_queue(name)
