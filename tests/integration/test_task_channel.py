"""The task request channel over a real socket pair: the task's blocking client
(``engine.execution.task_channel``) against the executor's server
(``engine.executor.task_requests``) on a real SQLite metadata database."""

from __future__ import annotations

import json
import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pytest
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.queries import connections as store
from engine.execution.task_channel import REQUEST_MAX_BYTES, ChannelError, TaskChannel
from engine.executor.task_requests import TaskRequestServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

pytestmark = pytest.mark.integration


class Served:
    def __init__(self, db: Database, cipher: KwargsCipher, channel: TaskChannel) -> None:
        self.db = db
        self.cipher = cipher
        self.channel = channel
        self.masked: list[str] = []

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)


@asynccontextmanager
async def serving(url: str) -> AsyncIterator[Served]:
    db = Database(url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    ours, theirs = socket.socketpair()
    channel = TaskChannel(theirs)
    env = Served(db, cipher, channel)
    server = TaskRequestServer(db=db, cipher=cipher, mask=env.masked.extend)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, ours)
            yield env
            channel.close()  # the server sees the end of the stream and returns
    db.dispose()


async def test_connections_and_variables_are_served_and_secrets_masked_first(
    migrated_sqlite_url: str,
) -> None:
    async with serving(migrated_sqlite_url) as served:
        await _connections_and_variables(served)


async def _connections_and_variables(served: Served) -> None:
    fields = {"conn_type": "http", "host": "h", "password": "pw-1234", "extra": {"token": "t-99"}}
    served.db.call(lambda s: store.upsert_connection(s, served.cipher, "api", fields))
    got = await served.call(served.channel.get_connection, "api")
    assert got["host"] == "h" and got["password"] == "pw-1234"
    assert sorted(served.masked) == ["pw-1234", "t-99"]
    assert await served.call(served.channel.get_connection, "nowhere") is None
    await served.call(served.channel.set_variable, "db_password", "v-secret", "desc")
    assert "v-secret" in served.masked
    assert await served.call(served.channel.get_variable, "db_password") == "v-secret"
    assert await served.call(served.channel.get_variable, "nope") is None
    assert await served.call(served.channel.delete_variable, "db_password") == 1
    await served.call(served.channel.mask, ["from-env-1"])
    assert "from-env-1" in served.masked


async def test_bad_requests_get_clear_errors_and_the_channel_keeps_working(
    migrated_sqlite_url: str,
) -> None:
    async with serving(migrated_sqlite_url) as served:
        await _bad_requests(served)


async def _bad_requests(served: Served) -> None:
    with pytest.raises(ChannelError, match="unknown request kind 'dag_states'"):
        await served.call(served.channel.request, "dag_states")
    with pytest.raises(ChannelError, match="get_variable request: malformed fields"):
        await served.call(lambda: served.channel.request("get_variable", nokey=1))
    with pytest.raises(ChannelError, match="over the channel's limit"):
        await served.call(served.channel.set_variable, "big", "x" * REQUEST_MAX_BYTES, None)
    wrong = KwargsCipher(Fernet.generate_key().decode())
    served.db.call(lambda s: store.set_variable(s, wrong, "v", "x"))
    with pytest.raises(ChannelError, match="variable 'v': cannot decrypt"):
        await served.call(served.channel.get_variable, "v")
    assert await served.call(served.channel.get_variable, "nope") is None  # still answers


async def test_an_oversized_line_is_refused_and_the_server_hangs_up(
    migrated_sqlite_url: str,
) -> None:
    db = Database(migrated_sqlite_url)
    ours, theirs = socket.socketpair()
    server = TaskRequestServer(
        db=db, cipher=KwargsCipher(Fernet.generate_key().decode()), mask=lambda _: None
    )

    def flood() -> bytes:
        theirs.sendall(b"x" * (REQUEST_MAX_BYTES + 10))
        return theirs.makefile("rb").readline()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, ours)
            answer = json.loads(await anyio.to_thread.run_sync(flood))
    assert answer["ok"] is False and "over the channel's limit" in answer["error"]
    theirs.close()
    db.dispose()
