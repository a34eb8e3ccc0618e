"""The REST API against its own OpenAPI document, by the schemathesis fuzzer: every operation
(the mutating ones too, on a throwaway database holding something of everything:
``api_world``), all of schemathesis's checks, a fixed example budget, derandomized, on
SQLite and PostgreSQL, against the real server (``ApiServer``) on a loopback port,
authenticated as an admin with a token.

It must find nothing: no server error, no status code or content type the document does not
list, no response that breaks its schema, no invalid request accepted, no valid request
refused. The fuzzer's closing summary is printed at the end of the test run
(``tests.reporting``).

The fuzzer's own token gets an id no generated value reaches (``FUZZ_TOKEN_ID``): the
fuzzer calls ``DELETE /tokens/{token_id}`` too, and revoking its own token would leave it
nothing but 401s to test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from sqlalchemy import update

from engine.api.credentials import digest
from engine.db.models import ApiToken
from tests.integration.api_world import World, build_world, world_database
from tests.integration.served_api import served
from tests.reporting import FUZZ_PROPERTY

if TYPE_CHECKING:
    from collections.abc import Iterator

# Under a loaded machine a run has taken 150 s; the fuzzer is stopped at 400 s (a failure).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(450)]

FUZZ_TOKEN_ID: Final = 1_000_003
#: Test cases per operation and phase: with 36 operations, about 1,300 requests a database.
MAX_EXAMPLES: Final = 5
SCHEMATHESIS: Final = Path(sys.executable).parent / "schemathesis"
CONFIG: Final = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fuzz_url(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[str]:
    yield from world_database(request, tmp_path_factory, "fuzz")


@pytest.fixture(scope="module")
def fuzz_world(fuzz_url: str, tmp_path_factory: Any) -> Iterator[World]:
    built = build_world(fuzz_url, tmp_path_factory.mktemp("fuzz-world"))
    yield built
    built.api.db.dispose()


def _fuzz_token(world: World) -> str:
    """A new admin token with id ``FUZZ_TOKEN_ID``."""
    token = world.api.token("admin-user")
    world.api.db.call(
        lambda s: s.execute(
            update(ApiToken).where(ApiToken.token_hash == digest(token)).values(id=FUZZ_TOKEN_ID)
        )
    )
    return token


def _summary(output: str) -> str:
    start = output.rfind("SUMMARY")
    return output[output.rfind("\n", 0, start) + 1 :] if start >= 0 else output[-4000:]


def test_no_request_breaks_the_api(
    fuzz_world: World, fuzz_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    token = _fuzz_token(fuzz_world)
    with served(fuzz_world.api.config, fuzz_world.api.db) as base:
        command = [
            str(SCHEMATHESIS),
            f"--config-file={CONFIG}",
            "run",
            f"{base}api/v1/openapi.json",
            "--checks=all",
            f"--max-examples={MAX_EXAMPLES}",
            "--generation-deterministic",
            "--workers=1",
            "--no-color",
            "--request-timeout=20",
            "--header",
            f"Authorization: Bearer {token}",
        ]
        done = subprocess.run(
            command,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=400,
            env={**os.environ, "SCHEMATHESIS_TELEMETRY": "false"},
            check=False,
        )
    database = fuzz_url.split(":", 1)[0].split("+", 1)[0]
    summary = f"on {database}:\n{_summary(done.stdout).strip()}"
    print(summary)
    request.node.user_properties.append((FUZZ_PROPERTY, summary))
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-3000:]
    selected = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", done.stdout)
    assert selected is not None, done.stdout[-3000:]
    assert len(set(selected.groups())) == 1, f"not every operation was tested: {selected[0]}"
