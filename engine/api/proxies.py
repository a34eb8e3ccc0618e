"""Who the client is behind a reverse proxy: forwarded headers, only from listed proxies.

A request's client is its TCP peer. Behind a reverse proxy (nginx, a load balancer) that is
the proxy, and the proxy names the real client in ``X-Forwarded-For`` or ``Forwarded``
(RFC 7239). Anyone can send those headers, so they are believed only when the peer is one
of ``[api] trusted_proxies`` (IP addresses or CIDR networks; none by default):

- the peer is not listed: the client is the peer, whatever the headers say;
- it is: the addresses the proxies appended are read from the right (the nearest hop
  first), skipping listed proxies; the first address not listed is the client. When every
  one is listed, the leftmost is.

``Forwarded`` is read when present, else ``X-Forwarded-For``. ``ForwardedClient`` puts the
client found in the ASGI scope (``request.client``): the login throttle
(``engine.api.login_guard``) and the logs see the real client. Uvicorn's own proxy-header
handling is off (``engine.api.server``): it trusts loopback by default, which would let any
local process pose as any client.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: A longer forwarded value is cut: it is a key of the login throttle, kept in memory.
MAX_CLIENT_LENGTH: Final = 64
_FORWARDED_FOR: Final = re.compile(r'(?i)(?:^|[;,\s])for\s*=\s*("[^"]*"|[^;,\s]*)')


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """``[api] trusted_proxies`` as networks (an address is a network of one); ValueError
    naming an item that is neither."""
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{item!r} is not an IP address or CIDR network") from exc
    return tuple(networks)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address from a forwarded value: ``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80``, ``::1``."""
    value = text.strip().strip('"')
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def is_trusted(value: str | None, trusted: Sequence[Network]) -> bool:
    address = None if value is None else _address(value)
    return address is not None and any(address in network for network in trusted)


def forwarded_chain(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The client addresses the proxies reported, leftmost (farthest) first: from
    ``Forwarded`` when present, else from ``X-Forwarded-For`` (repeated headers joined)."""
    forwarded = [v.decode("latin-1") for k, v in headers if k == b"forwarded"]
    if forwarded:
        return [m.group(1).strip('"') for m in _FORWARDED_FOR.finditer(",".join(forwarded))]
    xff = [v.decode("latin-1") for k, v in headers if k == b"x-forwarded-for"]
    return [part.strip() for part in ",".join(xff).split(",") if part.strip()]


def client_address(
    peer: str | None, headers: Iterable[tuple[bytes, bytes]], trusted: Sequence[Network]
) -> str | None:
    """The client of a request from ``peer`` carrying ``headers`` (see the module doc)."""
    if not trusted or not is_trusted(peer, trusted):
        return peer
    chain = forwarded_chain(headers)
    for hop in reversed(chain):
        if not is_trusted(hop, trusted):
            address = _address(hop)
            return str(address) if address is not None else hop[:MAX_CLIENT_LENGTH]
    if chain:
        address = _address(chain[0])
        return str(address) if address is not None else chain[0][:MAX_CLIENT_LENGTH]
    return peer


class ForwardedClient:
    """Sets the scope's ``client`` to the client found by ``client_address``."""

    def __init__(self, app: ASGIApp, *, trusted: Sequence[Network]) -> None:
        self.app, self.trusted = app, tuple(trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.trusted and scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            host = None if peer is None else str(peer[0])
            client = client_address(host, scope.get("headers", ()), self.trusted)
            if client is not None and client != host:
                scope = {**scope, "client": (client, 0)}
        await self.app(scope, receive, send)
