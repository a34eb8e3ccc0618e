"""``sluice pools`` as a user runs it: set, list, get, change, delete; ``default_pool`` is
there in a migrated database and cannot be deleted; bad input is an error naming it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.cli import invoke
from tests.e2e.helpers import sluice_env

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e


def test_pools_commands(tmp_path: Path, migrated_sqlite_url: str) -> None:
    env = sluice_env(tmp_path / "home", SLUICE__CORE__SQL_ALCHEMY_CONN=migrated_sqlite_url)

    def ok(*args: str) -> str:
        done = invoke(*args, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def as_json(*args: str) -> Any:
        return json.loads(ok(*args, "--json"))

    (default,) = as_json("pools", "list")
    assert (default["pool"], default["slots"], default["open"]) == ("default_pool", 128, 128)

    ok("pools", "set", "warehouse", "3", "--description", "three loads at once")
    (warehouse,) = as_json("pools", "get", "warehouse")
    assert (warehouse["slots"], warehouse["include_deferred"], warehouse["description"]) == (
        3,
        False,
        "three loads at once",
    )
    ok("pools", "set", "warehouse", "5", "--include-deferred")  # the description stays
    (warehouse,) = as_json("pools", "get", "warehouse")
    assert (warehouse["slots"], warehouse["include_deferred"], warehouse["description"]) == (
        5,
        True,
        "three loads at once",
    )
    table = ok("pools", "list")
    assert "OPEN" in table.splitlines()[0] and "warehouse" in table

    refused = invoke("pools", "delete", "default_pool", env=env)
    assert refused.returncode == 1 and "default_pool cannot be deleted" in refused.stderr
    bad = invoke("pools", "set", "tiny", "-2", env=env)
    assert bad.returncode == 1 and "pool slots must be >= 0, or -1" in bad.stderr
    ok("pools", "set", "open_bar", "-1")
    (open_bar,) = as_json("pools", "get", "open_bar")
    assert (open_bar["slots"], open_bar["open"]) == (-1, "unlimited")
    assert "Deleted pool warehouse" in ok("pools", "delete", "warehouse")
    missing = invoke("pools", "get", "warehouse", env=env)
    assert missing.returncode == 1 and "no pool named 'warehouse'" in missing.stderr
    assert [p["pool"] for p in as_json("pools", "list")] == ["default_pool", "open_bar"]
