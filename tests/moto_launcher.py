"""``python -m tests.moto_launcher -H 127.0.0.1 -p PORT``: moto's server, patched for speed.

Stock moto's SQS backend slows down as a queue deepens: every
message ``ReceiveMessage`` returns re-reads all queue attributes (three scans of the queue)
to check the retention period, and every visibility check goes through a slow naive-datetime
helper. Its ``Queue.delete_message`` also rebuilds the message list without the queue's
lock, so a message sent while another is deleted can vanish. And ``GetQueueAttributes``
reads each count off a fresh computation of every attribute, each message judged visible
or not against the clock of that moment: a batch in flight whose visibility timeout ends
between the read of ``ApproximateNumberOfMessages`` and that of
``ApproximateNumberOfMessagesNotVisible`` is in neither (the conformance kit's gate saw ten
messages gone from a queue that still held them). This launcher patches those four spots
(the counts of one request are read at one instant), then runs ``moto.server.main``
unchanged. Behaviour is otherwise stock moto.
``SLUICE_TEST_MOTO_QUEUES`` names queues to create before the server starts serving.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable

models: Any = importlib.import_module("moto.sqs.models")

#: the server's clock (a test replaces it)
wall_clock: Callable[[], float] = time.time
#: the instant a request's reads are judged at, where a request holds the clock still
_held = threading.local()


def _unix_time(dt: Any = None) -> float:
    if dt is not None:
        return float(_ORIGINAL_UNIX_TIME(dt))
    held: float | None = getattr(_held, "now", None)
    return wall_clock() if held is None else held


def _unix_time_millis(dt: Any = None) -> float:
    return _unix_time(dt) * 1000.0


def _is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
    queue = self.get_queue(queue_name)
    retain_until = float(queue.message_retention_period) + message.sent_timestamp / 1000
    return bool(retain_until > wall_clock())


def _delete_message(self: Any, receipt_handle: str) -> None:
    """Stock logic, but under the queue's lock and without rebuilding the list unlocked."""
    if receipt_handle in self.deleted_messages:
        return
    with self._messages_lock:
        doomed = [m for m in self._messages if m.had_receipt_handle(receipt_handle)]
        if not doomed:
            raise models.ReceiptHandleIsInvalid()
        for message in doomed:
            self.pending_messages.discard(message)
            self.deleted_messages.update(message.all_receipt_handles)
            self._messages.remove(message)


def _get_queue_attributes(self: Any, queue_name: str, attribute_names: list[str]) -> Any:
    """Stock logic, every count judged against one reading of the clock."""
    _held.now = wall_clock()
    try:
        return _ORIGINAL_GET_QUEUE_ATTRIBUTES(self, queue_name, attribute_names)
    finally:
        _held.now = None


_ORIGINAL_UNIX_TIME = models.unix_time
_ORIGINAL_GET_QUEUE_ATTRIBUTES = models.SQSBackend.get_queue_attributes


def patch() -> None:
    """Apply the patches to ``moto.sqs.models`` (idempotent)."""
    models.unix_time = _unix_time
    models.unix_time_millis = _unix_time_millis
    models.SQSBackend.is_message_valid_based_on_retention_period = (
        _is_message_valid_based_on_retention_period
    )
    models.Queue.delete_message = _delete_message
    models.SQSBackend.get_queue_attributes = _get_queue_attributes


#: JSON {queue name: {attribute: value}}: queues that exist before the server takes its first
#: request (a restarted server that kept its queues, as the conformance kit's private SQS)
QUEUES_ENV: Final = "SLUICE_TEST_MOTO_QUEUES"


def create_queues(spec: str, *, region: str = "us-east-1") -> None:
    from moto.core import DEFAULT_ACCOUNT_ID

    backend = models.sqs_backends[DEFAULT_ACCOUNT_ID][region]
    for name, attributes in json.loads(spec).items():
        backend.create_queue(name, **attributes)


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    patch()
    if spec := os.environ.get(QUEUES_ENV):
        create_queues(spec)
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
