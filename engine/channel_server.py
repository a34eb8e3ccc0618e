"""The request channel's parent end (the child's end and the protocol: ``engine.channel``).

``RequestServer.serve`` reads one JSON request per line from a child's socket and answers
each with the coroutine its ``handlers`` table has for the request's ``kind`` (called with
the request's other fields), until the child closes its end. A handler raises
``NotFoundError`` for what does not exist (the answer says ``not_found``) and
``RequestError`` (or any ``SluiceError`` / ``ValueError``) for a request it cannot serve:
the child gets an error answer naming the kind and why, and the parent never fails for a
child's request. A request over ``REQUEST_MAX_BYTES`` is answered with an error and the
channel closed (where the next request starts cannot be found); an answer over
``ANSWER_MAX_BYTES`` is replaced by an error saying so. A handler whose value is JSON text
already (a page of stored asset events) returns it as an ``EncodedValue``: it goes into the
answer as it is, not decoded and encoded again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import UNIXSocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from engine.channel import ANSWER_MAX_BYTES, REQUEST_MAX_BYTES
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable

_CLOSED: Final = (
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
)


class NotFoundError(SluiceError, LookupError):
    """What a request asked for does not exist (the answer says ``not_found``)."""


class RequestError(SluiceError, ValueError):
    """A request that cannot be served as sent (the answer carries the message)."""


@dataclass(frozen=True, slots=True)
class EncodedValue:
    """An answer's value that is JSON text already: the server puts it in the answer as it
    is (the handler vouches that it is valid JSON)."""

    text: str


class RequestServer:
    """Answers one child's requests from ``handlers`` (kind -> coroutine function)."""

    def __init__(self) -> None:
        self.served = 0
        self.handlers: dict[str, Callable[..., Awaitable[Any]]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} served={self.served} kinds={sorted(self.handlers)}>"

    async def serve(self, sock: socket.socket) -> None:
        """Answer requests on ``sock`` until the child closes it (takes ownership of it)."""
        try:
            stream = await UNIXSocketStream.from_socket(sock)
        except BaseException:
            sock.close()
            raise
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            while True:
                try:
                    line = await reader.receive_until(b"\n", REQUEST_MAX_BYTES)
                except _CLOSED:
                    return
                except anyio.DelimiterNotFound:
                    # cannot find where the next request starts: answer, then hang up
                    error = f"a request is over the channel's limit of {REQUEST_MAX_BYTES:,} bytes"
                    await _send(stream, {"id": None, "ok": False, "error": error})
                    return
                if not await _send(stream, await self.answer(line)):
                    return

    async def answer(self, line: bytes) -> dict[str, Any]:
        """The answer to one request line (never raises for the request's problems)."""
        request_id: Any = None
        kind = "?"
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or not isinstance(request.get("kind"), str):
                raise RequestError("a request must be a JSON object with a 'kind'")
            request_id, kind = request.pop("id", None), request.pop("kind")
            handler = self.handlers.get(kind)
            if handler is None:
                raise RequestError(
                    f"unknown request kind {kind!r}; known: {', '.join(sorted(self.handlers))}"
                )
            value = await handler(**request)
        except NotFoundError as exc:
            return {"id": request_id, "ok": False, "not_found": True, "error": str(exc)}
        except TypeError as exc:
            return _error(request_id, f"{kind} request: malformed fields: {exc}")
        except (SluiceError, ValueError) as exc:
            return _error(request_id, f"{kind} request: {exc}")
        self.served += 1
        answer = {"id": request_id, "ok": True, "value": value}
        size = len(_encoded(answer))
        if size > ANSWER_MAX_BYTES:
            return _error(
                request_id,
                f"{kind} request: the answer is {size:,} bytes, over the channel's limit of "
                f"{ANSWER_MAX_BYTES:,}",
            )
        return answer


def _error(request_id: Any, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "not_found": False, "error": message}


def _encoded(answer: dict[str, Any]) -> bytes:
    """The answer's line, without its newline; an ``EncodedValue`` goes in as it is."""
    value = answer.get("value")
    if not isinstance(value, EncodedValue):
        return json.dumps(answer, separators=(",", ":")).encode()
    head = json.dumps({**answer, "value": None}, separators=(",", ":"))
    return f"{head.removesuffix('null}')}{value.text}}}".encode()


async def _send(stream: UNIXSocketStream, answer: dict[str, Any]) -> bool:
    try:
        await stream.send(_encoded(answer) + b"\n")
    except _CLOSED:
        return False
    return True
