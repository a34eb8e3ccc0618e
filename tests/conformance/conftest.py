"""The conformance kit's fixtures: one ``kit`` per adapter module found beside this file.

``broker_<kind>.py`` modules are discovered at import (``broker.py``, the contract, is not
one); the session fixture ``kit`` is parametrised over their kinds (test ids ``[kafka]``,
``[sqs]``, ...), so ``pytest tests/conformance -k sqs`` runs one broker. Each test of the kit
goes to the xdist group ``conformance-<kind>``: one test process runs a broker's cases, and
its engines and servers start once. A case the adapter lists in ``cannot`` is marked
xfail(strict=True) with the adapter's reason when it starts (the adapter says so, not the
collection).
"""

from __future__ import annotations

import importlib
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from anyio.from_thread import start_blocking_portal

from tests.conformance.fleet import open_fleet
from tests.db_templates import pg_copy

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

    from tests.conformance.broker import KitBroker
    from tests.conformance.fleet import Fleet

HERE: Final = Path(__file__).parent

#: kind -> its adapter module, in name order
ADAPTERS: Final[dict[str, ModuleType]] = {
    path.stem.removeprefix("broker_"): importlib.import_module(f"tests.conformance.{path.stem}")
    for path in sorted(HERE.glob("broker_*.py"))
}


@pytest.fixture(scope="session", params=sorted(ADAPTERS))
def kit(request: pytest.FixtureRequest) -> Iterator[KitBroker]:
    """The broker under the kit (one per adapter module)."""
    with ADAPTERS[request.param].kit_broker(request) as broker:
        assert broker.kind == request.param, (broker.kind, request.param)
        yield broker


@pytest.fixture(scope="session")
def fleet(
    kit: KitBroker,
    pg_admin_url: str,
    pg_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """The broker's fleet (``tests/conformance/fleet.py``), shared by the process cases."""
    with ExitStack() as stack:
        portal = stack.enter_context(start_blocking_portal())
        url = stack.enter_context(pg_copy(pg_admin_url, pg_template))
        tmp = tmp_path_factory.mktemp(f"fleet-{kit.kind}")
        yield open_fleet(kit, portal, url, tmp, stack)


def _kind_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("kit")


def _case_of(item: pytest.Item) -> str:
    """``test_fan_out[kafka]`` -> ``fan_out``."""
    return item.name.split("[", 1)[0].removeprefix("test_")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = _kind_of(item)
        if kind is not None and item.nodeid.startswith("tests/conformance/"):
            item.add_marker(pytest.mark.xdist_group(f"conformance-{kind}"))


@pytest.fixture(autouse=True)
def _cannot(request: pytest.FixtureRequest, kit: KitBroker) -> None:
    """A case the broker's adapter says it cannot meet must fail (xfail strict)."""
    reason = kit.cannot.get(_case_of(request.node))
    if reason:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=f"{kit.kind}: {reason}"))
