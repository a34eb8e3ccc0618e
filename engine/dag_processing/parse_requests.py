"""The DAG processor's side of the parse-time reads (``engine.dag_processing.parse_store``).

``ParseRequestServer.serve`` answers one parsing child's ``get_variable`` /
``get_connection`` requests from the metadata database (decrypted with the DAG processor's
cipher: the child never holds the key) until the child closes its end. It keeps every
secret it hands out (a connection's password and secret extras, the value of a variable
whose key looks sensitive) so that the parse's stored error is masked with them
(``mask_error``) whatever the DAG file printed or raised. A request it cannot read or serve
gets an error answer; the DAG processor never fails for a child's request.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import UNIXSocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from engine.authoring.connections import Connection, InvalidConnectionError, is_sensitive
from engine.dag_processing.parse_store import ANSWER_MAX_BYTES, REQUEST_MAX_BYTES
from engine.dag_processing.parsing import mask_result
from engine.db.queries import connections as store
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    import socket

    from engine.crypto import KwargsCipher
    from engine.dag_processing.parsing import FileParseResult
    from engine.db.database import Database

logger = logging.getLogger(__name__)

_CLOSED: Final = (
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
)


class ParseRequestServer:
    """Answers one parsing child's reads; ``secrets`` holds what it handed out."""

    def __init__(self, *, db: Database, cipher: KwargsCipher, fileloc: str) -> None:
        self._db = db
        self._cipher = cipher
        self._fileloc = fileloc
        self.secrets: set[str] = set()
        self.served = 0

    def __repr__(self) -> str:
        return f"<ParseRequestServer file={self._fileloc} served={self.served}>"

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
                except (*_CLOSED, anyio.DelimiterNotFound):
                    return
                answer = json.dumps(await self.answer(line), separators=(",", ":"))
                try:
                    await stream.send(answer.encode() + b"\n")
                except _CLOSED:
                    return

    async def answer(self, line: bytes) -> dict[str, Any]:
        """The answer to one request line (never raises for the request's problems)."""
        request_id: Any = None
        try:
            request = json.loads(line)
            request_id = request.get("id") if isinstance(request, dict) else None
            value = await self._serve(request)
        except (SluiceError, ValueError, TypeError, AttributeError) as exc:
            return {"id": request_id, "ok": False, "error": str(exc)}
        if value is None:
            return {"id": request_id, "ok": False, "not_found": True, "error": "not found"}
        answer = {"id": request_id, "ok": True, "value": value}
        if len(json.dumps(answer)) > ANSWER_MAX_BYTES:
            return {"id": request_id, "ok": False, "error": "the answer is too big"}
        self.served += 1
        return answer

    async def _serve(self, request: dict[str, Any]) -> Any:
        kind = request.get("kind")
        if kind == "get_variable":
            return await self._variable(str(request["key"]))
        if kind == "get_connection":
            return await self._connection(str(request["conn_id"]))
        raise ValueError(f"unknown request kind {kind!r}; known: get_connection, get_variable")

    async def _variable(self, key: str) -> str | None:
        value = await self._db.read(partial(store.get_variable, cipher=self._cipher, key=key))
        if value is not None and is_sensitive(key):
            self.secrets.add(value)
        self._log("parse_variable_read", key=key, found=value is not None)
        return value

    async def _connection(self, conn_id: str) -> dict[str, Any] | None:
        read = partial(store.get_connection, cipher=self._cipher, conn_id=conn_id)
        fields = await self._db.read(read)
        if fields is not None:
            try:
                self.secrets.update(Connection.from_dict(conn_id, fields).secrets())
            except InvalidConnectionError as exc:
                raise ValueError(str(exc)) from exc
        self._log("parse_connection_read", conn_id=conn_id, found=fields is not None)
        return fields

    def _log(self, action: str, **fields: Any) -> None:
        logger.debug(
            "DAG file %s read %s at parse time",
            self._fileloc,
            fields,
            extra={"action": action, "fileloc": self._fileloc, **fields},
        )

    def mask_error(self, result: FileParseResult) -> FileParseResult:
        """``result`` with the secrets served masked in its error (message, traceback)."""
        return mask_result(result, self.secrets)
