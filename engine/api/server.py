"""The API part: the application served by uvicorn inside the engine's event loop.

The socket is bound before anything else, so a port in use fails the start with a message
naming it (and port 0 picks a free one, which ``url`` then tells). Uvicorn runs as a task of
the part; signals stay with the supervisor (uvicorn's own handlers are not installed), which
calls ``shutdown()``: the server stops accepting, lets requests in flight finish for up to
``SHUTDOWN_GRACE_S`` and closes. Like every part, it keeps a ``job`` row alive (type
``api``), so ``sluice jobs list`` and readiness show the API processes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio
import uvicorn

from engine.api.app import create_app
from engine.api.http_limits import LimitedH11Protocol
from engine.db.queries import users as users_sql
from engine.exceptions import SluiceError
from engine.jobs.service import JobService

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.config import Config
    from engine.db.database import Database

logger = logging.getLogger(__name__)

API_JOB: Final = "api"
SHUTDOWN_GRACE_S: Final = 5.0  # requests in flight (a streamed log) get this long to finish
BACKLOG: Final = 2048


class ApiServerError(SluiceError):
    """The API server cannot start (its address is in use or invalid)."""


@dataclass(frozen=True, slots=True)
class ApiServerSettings:
    host: str
    port: int
    heartbeat_s: float
    open_read: bool

    @classmethod
    def from_config(
        cls, config: Config, *, host: str | None = None, port: int | None = None
    ) -> ApiServerSettings:
        return cls(
            host=host or config.api.host,
            port=config.api.port if port is None else port,
            heartbeat_s=config.scheduler.scheduler_heartbeat_sec,
            open_read=config.api.open_read,
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``ApiServerError`` naming it if it cannot be."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ApiServerError(f"[api] host {host!r} cannot be resolved: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ApiServerError(
            f"the API server cannot listen on {host}:{port} ([api] host / port): "
            f"{exc.strerror or exc}; stop what uses it, or choose another port"
        ) from exc
    sock.setblocking(False)
    return sock


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class _Server(uvicorn.Server):
    """Uvicorn without its signal handlers: the supervisor owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiServer:
    """The REST API and UI on ``settings.host:port``, served until ``shutdown()``."""

    def __init__(self, *, config: Config, db: Database, settings: ApiServerSettings) -> None:
        self._config, self._db, self.settings = config, db, settings
        self._server: _Server | None = None
        self._socket: socket.socket | None = None
        self._stop_requested = False
        self.url: str | None = None

    def __repr__(self) -> str:
        return f"<ApiServer url={self.url} stopping={self._stop_requested}>"

    def bind(self) -> None:
        """Listen on the configured address now (``ApiServerError`` if it cannot): called
        before any part starts, so that a port in use stops the start at once."""
        if self._socket is None:
            self._socket = bind_socket(self.settings.host, self.settings.port)
            port = int(self._socket.getsockname()[1])
            self.url = url_of(self.settings.host, port)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self.bind()
        sock = self._socket
        assert sock is not None
        self._warn_if_exposed()
        server = _Server(self._uvicorn_config())
        self._server = server
        server.should_exit = self._stop_requested
        job = JobService(
            self._db, job_type=API_JOB, part=API_JOB, heartbeat_s=self.settings.heartbeat_s
        )
        try:
            async with job.running(), anyio.create_task_group() as tg:
                tg.start_soon(self._serve, server, sock)
                await self._wait_started(server)
                await self._hint_first_user()
                logger.info(
                    "API and UI listening on %s",
                    self.url,
                    extra={"action": "api_listening", "url": self.url},
                )
                task_status.started()
        finally:
            sock.close()
            self._socket = None

    def _uvicorn_config(self) -> uvicorn.Config:
        return uvicorn.Config(
            create_app(self._config, self._db),
            log_config=None,  # the CLI configured logging; uvicorn's loggers propagate to it
            log_level="warning",  # no startup chatter; errors still show
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
            lifespan="on",
            proxy_headers=False,  # engine.api.proxies: only [api] trusted_proxies are believed
            http=LimitedH11Protocol,  # 414 / 431 for an oversized request head, not a reset
            h11_max_incomplete_event_size=self._config.api.max_request_head_bytes,
        )

    async def _serve(self, server: _Server, sock: socket.socket) -> None:
        await server.serve(sockets=[sock])

    async def _wait_started(self, server: _Server) -> None:
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.01)

    def _warn_if_exposed(self) -> None:
        host = self.settings.host
        if self.settings.open_read and not is_loopback(host):
            logger.warning(
                "[api] open_read is on and the API listens on %s (not loopback): anyone who "
                "reaches it can read DAGs, runs, logs and events without logging in",
                host,
                extra={"action": "api_open_read_exposed", "host": host},
            )

    async def _hint_first_user(self) -> None:
        try:
            count = await self._db.read(users_sql.count_users)
        except SluiceError:
            return
        if count == 0:
            logger.warning(
                "No API/UI user exists yet: make one with `sluice users create --username "
                "admin --role admin`",
                extra={"action": "api_no_users"},
            )

    def shutdown(self) -> None:
        """Stop accepting requests; those in flight get ``SHUTDOWN_GRACE_S`` to finish."""
        self._stop_requested = True
        if self._server is not None:
            self._server.should_exit = True
