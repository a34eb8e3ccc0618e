"""Oversized request heads answered, not reset: 414 for a request line, 431 for headers.

Uvicorn's h11 protocol refuses a request head (request line and headers) larger than its
``h11_max_incomplete_event_size`` with a plain-text 400 and closes the socket at once. The
client is usually still sending (a 1 MB query string, a 200 KB cookie), so the kernel
answers the unread bytes with a reset and the client sees "connection reset" instead of
any answer.

``LimitedH11Protocol`` answers such a head with the right status as problem JSON:

- 414 URI Too Long when the request line alone does not fit (no line end in what came);
- 431 Request Header Fields Too Large when the headers do not;

and then closes gently ("lingering close", as web servers do): it ends its side of the
connection after the answer, reads and drops what the client still sends, and closes when
the client is done or after ``LINGER_S``. The limit is ``[api] max_request_head_bytes``.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.api.problems import PROBLEM_JSON, problem

logger = logging.getLogger(__name__)

#: How long an answered connection keeps draining what the client still sends.
LINGER_S: Final = 5.0
#: h11's own limit, used when uvicorn is given none.
H11_DEFAULT_HEAD_BYTES: Final = 16 * 1024


def head_length(received: bytes | bytearray) -> int:
    """The length of the request head in ``received`` (all of it while its end has not come)."""
    end = received.find(b"\r\n\r\n")
    return len(received) if end < 0 else end + 4


def head_problem(buffered: bytes, limit: int) -> tuple[int, str]:
    """The status and detail for a request head over ``limit`` bytes, from what came of it:
    414 when the request line alone is too long, else 431."""
    line_end = buffered.find(b"\n")
    if line_end < 0 or line_end > limit:
        return 414, f"the request line (method, path and query) is longer than {limit} bytes"
    return 431, f"the request's line and headers are larger than {limit} bytes in all"


def problem_bytes(status: int, detail: str) -> bytes:
    """A whole HTTP/1.1 answer carrying ``problem(status, detail)``; it closes the connection."""
    body = json.dumps(problem(status, detail)).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"content-type: {PROBLEM_JSON}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class LimitedH11Protocol(H11Protocol):
    """Uvicorn's h11 protocol, answering an oversized request head with 414 or 431.

    h11 checks its limit only while a head is incomplete, so a large head that arrives in
    one read would pass: the bytes of a head are counted here as they come, before h11
    sees them; h11's own refusal (``send_400_response``) is answered the same way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._draining = False
        self._head = bytearray()  # what came of the request head being read

    def data_received(self, data: bytes) -> None:
        if self._draining:  # after the answer: dropped until the client is done
            return
        if self.conn.their_state is h11.IDLE:  # reading a request head
            self._head += data
            if head_length(self._head) > self._limit:
                self._refuse(bytes(self._head))
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head.clear()

    def eof_received(self) -> None:
        if self._draining:  # the client is done: nothing will be reset now
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """What uvicorn calls when h11 refuses what came: a head over h11's limit gets 414 /
        431 and a lingering close; anything else uvicorn's plain 400."""
        buffered, _ = self.conn.trailing_data
        if self.conn.their_state is not h11.ERROR or len(buffered) <= self._limit:
            super().send_400_response(msg)
            return
        self._refuse(buffered)

    def _refuse(self, buffered: bytes) -> None:
        status, detail = head_problem(buffered, self._limit)
        client = "%s:%d" % self.client if self.client else "unknown"  # noqa: UP031
        logger.warning(
            "Refused a request from %s: %s",
            client,
            detail,
            extra={"action": "api_request_head_too_large", "status": status},
        )
        self.transport.write(problem_bytes(status, detail))
        self._draining = True
        self._head.clear()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    @property
    def _limit(self) -> int:
        configured: int | None = self.config.h11_max_incomplete_event_size
        return H11_DEFAULT_HEAD_BYTES if configured is None else configured
