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

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from engine.authoring.connections import Connection, InvalidConnectionError, is_sensitive
from engine.channel_server import NotFoundError, RequestError, RequestServer
from engine.dag_processing.parsing import mask_result
from engine.db.queries import connections as store

if TYPE_CHECKING:
    from engine.crypto import KwargsCipher
    from engine.dag_processing.parsing import FileParseResult
    from engine.db.database import Database

logger = logging.getLogger(__name__)


class ParseRequestServer(RequestServer):
    """Answers one parsing child's reads; ``secrets`` holds what it handed out."""

    def __init__(self, *, db: Database, cipher: KwargsCipher, fileloc: str) -> None:
        self._db = db
        self._cipher = cipher
        self._fileloc = fileloc
        self.secrets: set[str] = set()
        super().__init__()
        self.handlers = {"get_connection": self._connection, "get_variable": self._variable}

    def __repr__(self) -> str:
        return f"<ParseRequestServer file={self._fileloc} served={self.served}>"

    async def _variable(self, *, key: str) -> str:
        value = await self._db.read(partial(store.get_variable, cipher=self._cipher, key=key))
        self._log("parse_variable_read", key=key, found=value is not None)
        if value is None:
            raise NotFoundError(f"variable {key!r} does not exist")
        if is_sensitive(key):
            self.secrets.add(value)
        return value

    async def _connection(self, *, conn_id: str) -> dict[str, Any]:
        read = partial(store.get_connection, cipher=self._cipher, conn_id=conn_id)
        fields = await self._db.read(read)
        self._log("parse_connection_read", conn_id=conn_id, found=fields is not None)
        if fields is None:
            raise NotFoundError(f"connection {conn_id!r} is not defined")
        try:
            self.secrets.update(Connection.from_dict(conn_id, fields).secrets())
        except InvalidConnectionError as exc:
            raise RequestError(str(exc)) from exc
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
