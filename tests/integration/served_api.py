"""The real API server (``engine.api.server.ApiServer``: uvicorn with the engine's protocol
settings) on a free loopback port, run in a thread of the test process by an anyio portal,
for what only a served API shows: raw sockets (oversized request lines and headers), an
external client such as the schemathesis fuzzer.

``served(config, db)`` is a context manager yielding the server's base URL (``http://
127.0.0.1:PORT/``); leaving it stops the server as the supervisor does (``shutdown()``)
and waits for it to finish.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from anyio.from_thread import start_blocking_portal

from engine.api.server import ApiServer, ApiServerSettings

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.config import Config
    from engine.db.database import Database


@contextlib.contextmanager
def served(config: Config, db: Database) -> Iterator[str]:
    """``ApiServer`` on 127.0.0.1 and a free port until the block ends; yields its URL."""
    settings = ApiServerSettings.from_config(config, host="127.0.0.1", port=0)
    server = ApiServer(config=config, db=db, settings=settings)
    with start_blocking_portal() as portal:
        future, _ = portal.start_task(server.run)
        try:
            assert server.url is not None
            yield server.url
        finally:
            portal.call(server.shutdown)
            future.result(timeout=30)
