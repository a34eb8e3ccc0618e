"""No request makes the API or UI answer 5xx (issue 33's reproductions, each a clean 4xx now),
on SQLite and PostgreSQL: out-of-range integers, long searches, NaN and infinities in conf
and extra, a run dated 9999-12-31, a 500 in a browser; and, against the served API on a raw
socket, a 1 MB query string (414) and 200 KB of headers (431) answered instead of reset."""

from __future__ import annotations

import http.client
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest

from engine.api.rest.common import MAX_YEAR, MIN_YEAR
from engine.api.storable import MAX_JSON_DEPTH
from engine.views.common import MAX_OFFSET
from tests.integration.api_world import World, build_world, world_database
from tests.integration.served_api import served

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
TOO_BIG = "99999999999999999999"
JUST_OVER_INT64 = str(MAX_OFFSET + 1)
PAGED = (
    "/api/v1/dags",
    "/api/v1/runs",
    "/api/v1/asset-events",
    "/api/v1/triggers",
    "/api/v1/jobs",
    "/api/v1/assets",
    "/api/v1/streams",
    "/api/v1/dags/etl/runs",
    "/api/v1/tokens",
    "/api/v1/assets/report/partitions",
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def limits_url(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[str]:
    yield from world_database(request, tmp_path_factory, "limits")


@pytest.fixture(scope="module")
def world(limits_url: str, tmp_path_factory: Any) -> Iterator[World]:
    built = build_world(limits_url, tmp_path_factory.mktemp("limits-world"))
    yield built
    built.api.db.dispose()


def _task(world: World, suffix: str = "") -> str:
    return f"/api/v1/dags/etl/runs/{quote(world.etl_run, safe='')}/tasks/extract{suffix}"


def _refused(answer: Any, status: int = 422) -> dict[str, Any]:
    assert answer.status_code == status, (answer.status_code, answer.text[:500])
    assert answer.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = answer.json()
    return body


@pytest.mark.parametrize("path", PAGED)
@pytest.mark.parametrize("offset", [TOO_BIG, JUST_OVER_INT64, "-1"])
def test_an_offset_out_of_range_is_a_422(world: World, path: str, offset: str) -> None:
    body = _refused(world.client("admin").get(path, params={"offset": offset}))
    assert body["errors"][0]["loc"] == ["query", "offset"]


@pytest.mark.parametrize("path", PAGED[:8])
def test_the_largest_offset_is_an_empty_page(world: World, path: str) -> None:
    answer = world.client("admin").get(path, params={"offset": str(MAX_OFFSET)})
    assert answer.status_code == 200, answer.text
    assert answer.json()["items"] == []


@pytest.mark.parametrize("suffix", ["", "/logs", "/results", "/state-store"])
def test_a_map_index_out_of_range_is_a_422(world: World, suffix: str) -> None:
    client = world.client("viewer")
    for value in (TOO_BIG, str(2**31)):
        body = _refused(client.get(_task(world, suffix), params={"map_index": value}))
        assert body["errors"][0]["loc"] == ["query", "map_index"]


def test_try_number_and_log_offset_out_of_range_are_422s(world: World) -> None:
    client = world.client("viewer")
    _refused(client.get(_task(world, "/logs"), params={"try_number": TOO_BIG}))
    _refused(client.get(_task(world, "/logs"), params={"offset": TOO_BIG}))
    log = client.get(_task(world, "/logs"), params={"offset": str(MAX_OFFSET)})
    assert log.status_code == 200, log.text
    assert log.json()["content"] == ""


def test_ids_out_of_range_are_422s(world: World) -> None:
    client = world.client("admin")
    _refused(client.get("/api/v1/triggers", params={"triggerer_id": TOO_BIG}))
    _refused(client.delete(f"/api/v1/tokens/{TOO_BIG}"))
    body = {"map_index": int(TOO_BIG)}
    _refused(client.post(_task(world, "/clear"), json=body))


@pytest.mark.parametrize("path", ["/api/v1/dags", "/api/v1/assets"])
def test_a_long_search_is_a_422_and_250_characters_are_searched(world: World, path: str) -> None:
    client = world.client("viewer")
    body = _refused(client.get(path, params={"search": "x" * 60_000}))
    assert body["errors"][0]["loc"] == ["query", "search"]
    answer = client.get(path, params={"search": "%" * 250})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_conf_with_a_non_finite_number_is_refused_saying_where(world: World, number: str) -> None:
    raw = '{"conf": {"limits": {"rate": %s}}}' % number  # noqa: UP031 - JSON with a bare NaN
    answer = world.client("op").post(
        "/api/v1/dags/etl/runs", content=raw, headers={"Content-Type": "application/json"}
    )
    body = _refused(answer)
    assert "conf.limits.rate" in body["detail"]
    assert number in body["detail"] or "nan" in body["detail"].lower()


def test_extra_with_nan_or_a_nul_character_is_refused(world: World) -> None:
    client = world.client("op")
    raw = '{"asset": "report", "extra": {"score": NaN}}'
    answer = client.post(
        "/api/v1/asset-events", content=raw, headers={"Content-Type": "application/json"}
    )
    assert "extra.score" in _refused(answer)["detail"]
    nul = client.post("/api/v1/asset-events", json={"asset": "report", "extra": {"k": "a\x00b"}})
    assert "extra.k" in _refused(nul)["detail"]


@pytest.mark.parametrize(
    "date", ["9999-12-31T00:00:00Z", f"{MAX_YEAR + 1}-01-01T00:00:00Z", "1899-12-31T23:00:00Z"]
)
def test_a_logical_date_outside_the_sane_years_is_refused(world: World, date: str) -> None:
    answer = world.client("op").post("/api/v1/dags/etl/runs", json={"logical_date": date})
    body = _refused(answer)
    assert f"{MIN_YEAR} to {MAX_YEAR}" in body["detail"]
    assert body["errors"][0]["loc"] == ["body", "logical_date"]


def test_dates_in_filters_outside_the_sane_years_or_as_numbers_are_refused(world: World) -> None:
    client = world.client("viewer")
    for since in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0.5"):
        _refused(client.get("/api/v1/runs", params={"since": since}))


def test_a_number_for_a_boolean_or_an_integer_is_refused(world: World) -> None:
    client = world.client("op")
    _refused(client.post("/api/v1/dags/etl/clear", json={"map_index": False}))
    _refused(client.post("/api/v1/dags/etl/clear", json={"dry_run": 1}))


def test_a_405_lists_every_method_of_the_path(world: World) -> None:
    answer = world.client("op").delete("/api/v1/asset-events")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, POST"


def test_ui_pages_refuse_out_of_range_numbers_with_the_error_page(world: World) -> None:
    client = world.api.client()
    world.api.login(client, "viewer-user")
    html = {"Accept": "text/html"}
    run = quote(world.etl_run, safe="")
    for path in (
        f"/dags?offset={TOO_BIG}",
        f"/assets?offset={TOO_BIG}",
        f"/dags/etl/runs/{run}/tasks/extract?map_index={TOO_BIG}",
        f"/dags/etl/runs/{run}/tasks/extract?try={TOO_BIG}",
    ):
        answer = client.get(path, headers=html)
        assert answer.status_code == 422, (path, answer.text[:300])
        assert answer.headers["content-type"].startswith("text/html")


def test_a_500_in_the_browser_is_the_error_page(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.views import dags as dags_view

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("boom: a secret detail")

    monkeypatch.setattr(dags_view, "list_dags", broken)
    client = world.api.client()
    world.api.login(client, "viewer-user")
    page = client.get("/dags", headers={"Accept": "text/html"})
    assert page.status_code == 500
    assert page.headers["content-type"].startswith("text/html")
    assert "500 Internal Server Error" in page.text
    assert "boom" not in page.text
    api = world.client("viewer").get("/api/v1/dags")
    assert api.status_code == 500
    assert api.headers["content-type"].startswith(PROBLEM)


# --- oversized request heads, on a raw socket against the served API ---------------------


def _exchange(url: str, head: bytes) -> tuple[int, bytes]:
    """Send ``head`` on a new connection, read the answer to its end: (status, body)."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def served_url(world: World) -> Iterator[str]:
    with served(world.api.config, world.api.db) as url:
        yield url


def test_a_100_000_character_search_is_a_414(served_url: str) -> None:
    """Longer than a request head may be ([api] max_request_head_bytes): refused before the
    application reads it."""
    line = b"GET /api/v1/dags?search=" + b"x" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert _exchange(served_url, line)[0] == 414


def test_a_one_megabyte_query_string_is_a_414(served_url: str) -> None:
    query = b"search=" + b"a" * 1_048_576
    status, body = _exchange(
        served_url, b"GET /api/v1/dags?" + query + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status == 414
    assert b"request line" in body


def test_two_hundred_kilobytes_of_headers_is_a_431(served_url: str) -> None:
    headers = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"b" * 1000) for i in range(200))
    status, body = _exchange(
        served_url, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    )
    assert status == 431
    assert b"headers" in body


def test_a_request_under_the_limits_is_served(served_url: str) -> None:
    status, body = _exchange(
        served_url, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 200
    assert b"ok" in body


def test_requests_kept_alive_on_one_connection_are_each_served(served_url: str) -> None:
    """The head counting starts over with each request of a kept-alive connection."""
    host, port = served_url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for _ in range(3):
            connection.request("GET", "/api/v1/health", headers={"X-Filler": "a" * 30_000})
            answer = connection.getresponse()
            assert answer.status == 200
            assert answer.read() == b'{"status":"ok"}'
    finally:
        connection.close()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/dags/a%00b",
        "/api/v1/dags?search=a%00",
        "/api/v1/assets/x%00",
        "/api/v1/runs?dag_id=%00",
        "/api/v1/asset-events?asset=%00",
        "/api/v1/tokens?user=%00",
        "/api/v1/streams?key=%00",
    ],
)
def test_a_nul_character_in_the_path_or_query_is_a_422(world: World, path: str) -> None:
    """PostgreSQL cannot compare text holding a NUL: refused before any query runs."""
    assert "NUL" in _refused(world.client("admin").get(path))["detail"]


def test_a_conf_nested_too_deeply_is_refused_saying_where(world: World) -> None:
    deep: Any = 1
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    answer = world.client("op").post("/api/v1/dags/etl/runs", json={"conf": {"x": deep}})
    assert f"nested deeper than {MAX_JSON_DEPTH}" in _refused(answer)["detail"]
