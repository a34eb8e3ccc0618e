"""Guarding password logins: few Argon2 checks at once, and a backoff after failures.

- **Few checks at once.** An Argon2id check takes tens of milliseconds of CPU and 64 MiB of
  memory on purpose; ``check_password`` runs at most ``PASSWORD_CHECKS`` of them at a time
  (in worker threads), so a burst of logins cannot starve the engine parts that share the
  process, nor its memory.
- **Backoff.** After ``MAX_FAILURES`` failed logins within ``WINDOW_S`` for one username, or
  from one client address, further attempts for it are refused (429 with ``Retry-After``)
  for ``BASE_DELAY_S``, doubling with each further failure up to ``MAX_DELAY_S``. A refused
  attempt checks no password. A success clears its username's failures (not its address's:
  one valid account must not unlock guessing the others). A key is forgotten after
  ``WINDOW_S`` without failures once its delay is over.

The failure counts live **in memory, per API process**: with several API processes behind a
load balancer each counts its own (an attacker gets at most that many times the attempts),
and a restart forgets them.

The client address is ``request.client``: the TCP peer, or, when the peer is one of ``[api]
trusted_proxies``, the client the proxy names in ``X-Forwarded-For`` / ``Forwarded``
(``engine.api.proxies``). Those headers from any other peer are ignored, so a client cannot
escape its address's limit by sending a new forwarded address with each try. Behind a proxy
that is not listed every client has the proxy's address: list it, or only the per-username
limit tells clients apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from engine.api import credentials

if TYPE_CHECKING:
    from collections.abc import Callable

PASSWORD_CHECKS: Final = 2
MAX_FAILURES: Final = 5
WINDOW_S: Final = 300.0
BASE_DELAY_S: Final = 30.0
MAX_DELAY_S: Final = 900.0
MAX_KEYS: Final = 10_000  # bounded memory: the oldest keys are dropped past this


@dataclass(slots=True)
class _Failures:
    times: list[float] = field(default_factory=list)  # failures within the window
    lockouts: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginGuard:
    """The login limits of one API application (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: dict[tuple[str, str], _Failures] = {}
        self._limiter: anyio.CapacityLimiter | None = None

    @staticmethod
    def keys(username: str, client: str | None) -> list[tuple[str, str]]:
        found = [("user", username.casefold())]
        if client:
            found.append(("client", client))
        return found

    def retry_after(self, keys: list[tuple[str, str]]) -> int | None:
        """Seconds until ``keys`` may try again (rounded up); None when they may now."""
        now = self._clock()
        waits = [e.locked_until - now for k in keys if (e := self._keys.get(k)) is not None]
        longest = max(waits, default=0.0)
        return int(longest) + 1 if longest > 0 else None

    def failed(self, keys: list[tuple[str, str]]) -> None:
        now = self._clock()
        for key in keys:
            entry = self._keys.pop(key, None)
            if entry is None or self._forgotten(entry, now):
                entry = _Failures()
            entry.times = [t for t in entry.times if now - t < WINDOW_S]
            entry.times.append(now)
            entry.last = now
            if entry.lockouts or len(entry.times) >= MAX_FAILURES:
                entry.lockouts += 1
                delay = min(BASE_DELAY_S * 2 ** (entry.lockouts - 1), MAX_DELAY_S)
                entry.locked_until = now + delay
            self._keys[key] = entry  # last in the dict: the most recently failed
        while len(self._keys) > MAX_KEYS:
            del self._keys[next(iter(self._keys))]

    def succeeded(self, username: str) -> None:
        self._keys.pop(("user", username.casefold()), None)

    @staticmethod
    def _forgotten(entry: _Failures, now: float) -> bool:
        return now >= entry.locked_until and now - entry.last >= WINDOW_S

    async def check_password(self, stored_hash: str | None, password: str) -> bool:
        """Whether ``password`` matches ``stored_hash`` (None: no such user, the time of a
        check is spent anyway); at most ``PASSWORD_CHECKS`` run at once, in threads."""
        if self._limiter is None:  # made on the event loop that serves the requests
            self._limiter = anyio.CapacityLimiter(PASSWORD_CHECKS)
        if stored_hash is None:
            return await anyio.to_thread.run_sync(
                credentials.verify_unknown_user, password, limiter=self._limiter
            )
        return await anyio.to_thread.run_sync(
            credentials.verify_password, stored_hash, password, limiter=self._limiter
        )
