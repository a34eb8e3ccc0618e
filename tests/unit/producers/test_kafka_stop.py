"""Stopping aiokafka clients: a stray ``CancelledError`` from ``stop()`` is a failed stop.

aiokafka's consumer ``stop()`` awaits its coordinator's task, which it may have cancelled
itself (a broker that went away): the ``CancelledError`` reaches a caller nobody cancelled.
The producer warns and still stops its next client (the dead-letter producer, whose sender
task was otherwise left pending); a real cancellation of the caller goes through.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import anyio

from producers.kafka_errors import stop_client

if TYPE_CHECKING:
    import pytest


class Client:
    def __init__(self, *, stray: bool = False, hang: bool = False) -> None:
        self.stray, self.hang, self.stopped = stray, hang, False

    async def stop(self) -> None:
        if self.hang:
            await anyio.sleep_forever()
        if self.stray:
            inner = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
            await asyncio.sleep(0)
            inner.cancel()
            await inner
        self.stopped = True


async def test_a_stray_cancel_from_stop_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(5):
        for client in (Client(stray=True), Client()):
            await stop_client(client, where="k:9092 group='g'", group_id="g")
    assert [r.action for r in caplog.records if r.levelno == logging.WARNING] == [
        "kafka.close_failed"
    ]


async def test_a_real_cancellation_of_the_caller_goes_through() -> None:
    with anyio.fail_after(5):
        with anyio.move_on_after(0.05) as scope:
            await stop_client(Client(hang=True), where="k:9092", group_id="g")
        assert scope.cancelled_caught
