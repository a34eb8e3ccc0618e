"""A Celery worker whose heartbeat ended stops itself rather than take tries it would lose."""

from __future__ import annotations

import os
import signal
from concurrent.futures import Future

import pytest

from engine.executor.celery import worker


@pytest.mark.parametrize("ending", ["error", "cancelled", "returned"])
def test_the_worker_stops_only_when_its_heartbeat_failed(
    ending: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    done: Future[None] = Future()
    if ending == "error":
        done.set_exception(RuntimeError("the heartbeat task crashed"))
    elif ending == "cancelled":
        done.cancel()
    else:
        done.set_result(None)
    worker._stop_when_heartbeat_ends(done)
    if ending == "error":
        assert sent == [(os.getpid(), signal.SIGTERM)]
        assert "heartbeat ended: the heartbeat task crashed" in caplog.text
    else:
        assert sent == []
