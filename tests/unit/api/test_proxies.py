"""Who the client is behind a proxy (``engine.api.proxies``): forwarded headers believed only
from a listed proxy, read from the nearest hop, listed proxies skipped."""

from __future__ import annotations

import re

import pytest

from engine.api.proxies import client_address, forwarded_chain, parse_networks

TRUSTED = parse_networks(["10.0.0.0/8", "192.168.1.7", "fd00::/8"])


def _headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in values.items()]


@pytest.mark.parametrize(
    ("peer", "headers", "client"),
    [
        # an unlisted peer: its headers are ignored, whatever they say
        ("203.0.113.9", _headers(x_forwarded_for="1.1.1.1"), "203.0.113.9"),
        ("203.0.113.9", _headers(forwarded="for=1.1.1.1"), "203.0.113.9"),
        # a listed proxy: the nearest address that is not a listed proxy
        ("10.1.2.3", _headers(x_forwarded_for="1.1.1.1"), "1.1.1.1"),
        ("10.1.2.3", _headers(x_forwarded_for="6.6.6.6, 1.1.1.1, 10.9.9.9"), "1.1.1.1"),
        ("192.168.1.7", _headers(x_forwarded_for="1.1.1.1:4711"), "1.1.1.1"),
        # Forwarded (RFC 7239) wins over X-Forwarded-For; quoted IPv6 with a port
        (
            "10.1.2.3",
            _headers(forwarded='for="[2001:db8::1]:80";proto=https', x_forwarded_for="6.6.6.6"),
            "2001:db8::1",
        ),
        ("fd00::5", _headers(forwarded="for=6.6.6.6, for=2.2.2.2"), "2.2.2.2"),
        # every hop a listed proxy: the leftmost; no header at all: the proxy itself
        ("10.1.2.3", _headers(x_forwarded_for="10.0.0.1, 10.0.0.2"), "10.0.0.1"),
        ("10.1.2.3", [], "10.1.2.3"),
        # a value that is no address, reported by the listed proxy: kept as it is (cut)
        ("10.1.2.3", _headers(x_forwarded_for="unknown"), "unknown"),
    ],
)
def test_the_client_of_a_request(
    peer: str, headers: list[tuple[bytes, bytes]], client: str
) -> None:
    assert client_address(peer, headers, TRUSTED) == client


def test_no_trusted_proxy_means_the_peer() -> None:
    assert client_address("10.1.2.3", _headers(x_forwarded_for="1.1.1.1"), ()) == "10.1.2.3"


def test_repeated_headers_are_joined_in_order() -> None:
    headers = [(b"x-forwarded-for", b"1.1.1.1"), (b"x-forwarded-for", b"2.2.2.2, 3.3.3.3")]
    assert forwarded_chain(headers) == ["1.1.1.1", "2.2.2.2", "3.3.3.3"]


def test_a_bad_network_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=re.escape("'10.0.0.0/33' is not an IP address")):
        parse_networks(["10.0.0.0/33"])
