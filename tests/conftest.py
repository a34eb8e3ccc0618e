"""Session fixtures for the real servers tests talk to (docs/tests.md: the servers).

A server that cannot be started fails the run with a message saying what is missing; it is
never silently skipped.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text

if TYPE_CHECKING:
    from collections.abc import Iterator

PG_ADMIN_URL = os.environ.get(
    "SLUICE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


# Property tests: a budget of examples set once per profile, not per test (a test states its
# own only where an example is expensive). `make test` runs the "ci" profile (a fixed,
# derandomized budget: the same examples every run, nothing stored between runs); a plain
# `pytest` explores at random ("dev"); `--hypothesis-profile deep` searches harder by hand.
settings.register_profile(
    "ci", max_examples=100, derandomize=True, database=None, deadline=None, print_blob=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("deep", max_examples=2000, deadline=None)
settings.load_profile("dev")


def _pg_answers(url: str) -> bool:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception:
        return False
    finally:
        engine.dispose()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _throwaway_cluster() -> tuple[str, Path, str]:
    """initdb + pg_ctl a private cluster as the postgres user; returns (url, dir, pg_ctl)."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        pytest.fail(
            "PostgreSQL is not answering on 127.0.0.1:5432 and no server binaries were found "
            "under /usr/lib/postgresql/*/bin: install the Debian package `postgresql`"
        )
    bindir = bins[-1]
    datadir = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
    shutil.chown(datadir, user="postgres")
    port = _free_port()
    run = {"user": "postgres", "check": True, "capture_output": True}
    subprocess.run([f"{bindir}/initdb", "-A", "trust", "-U", "postgres", str(datadir)], **run)
    opts = f"-c listen_addresses=127.0.0.1 -c port={port} -c fsync=off -k /tmp"
    subprocess.run(
        [
            f"{bindir}/pg_ctl",
            "-D",
            str(datadir),
            "-o",
            opts,
            "-w",
            "start",
            "-l",
            str(datadir / "log"),
        ],
        **run,
    )
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", datadir, bindir


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A PostgreSQL server: the machine's, started if down, else a throwaway cluster."""
    if _pg_answers(PG_ADMIN_URL):
        yield PG_ADMIN_URL
        return
    subprocess.run(
        "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
        shell=True,
        capture_output=True,
        check=False,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _pg_answers(PG_ADMIN_URL):
            yield PG_ADMIN_URL
            return
        time.sleep(0.2)
    url, datadir, bindir = _throwaway_cluster()
    try:
        yield url
    finally:
        subprocess.run(
            [f"{bindir}/pg_ctl", "-D", str(datadir), "-m", "immediate", "stop"],
            user="postgres",
            capture_output=True,
            check=False,
        )
        shutil.rmtree(datadir, ignore_errors=True)


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base = pg_admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sluice.db'}"


#: The databases a test may run on. A test that asks for ``db_url`` or ``migrated_db_url``
#: runs on SQLite; marked ``both_databases`` (itself, its class or its module) it runs on
#: both. Only what depends on the dialect is marked: see ``pytest_generate_tests``.
DATABASES: Final = ("sqlite", "postgres")
_DATABASE_FIXTURES: Final = ("db_url", "migrated_db_url")


def _parametrized_names(metafunc: pytest.Metafunc) -> set[str]:
    names: set[str] = set()
    for marker in metafunc.definition.iter_markers("parametrize"):
        argnames = marker.args[0] if marker.args else marker.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = argnames.split(",")
        names.update(name.strip() for name in argnames)
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that takes a database on SQLite, and also on PostgreSQL when marked
    ``both_databases``; a test that parametrizes the fixture itself chooses on its own."""
    both = metafunc.definition.get_closest_marker("both_databases") is not None
    chosen = _parametrized_names(metafunc)
    for name in _DATABASE_FIXTURES:
        if name in metafunc.fixturenames and name not in chosen:
            metafunc.parametrize(name, DATABASES if both else DATABASES[:1], indirect=True)


#: Where a test lives -> when it is handed to a test process: the slow ones first, so that the
#: quick ones fill the gaps at the end of the run instead of a long one running alone.
_START_ORDER: Final = ("tests/browser/", "tests/e2e/", "tests/conformance/", "tests/integration/")
_SHARED_SCOPES: Final = frozenset({"package", "module", "class"})


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Does the test use a fixture of the test suite that outlives it (a module's engine or
    world)? Such tests run in one process, in their order (they may build on each other)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in _SHARED_SCOPES and definition.func.__module__.startswith("tests.")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def _start_rank(item: pytest.Item) -> int:
    path = item.nodeid
    return next((i for i, prefix in enumerate(_START_ORDER) if path.startswith(prefix)), 99)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the tests that share a module's fixture together (``--dist loadgroup`` sends an
    ``xdist_group`` to one process) and start the slow directories first."""
    for item in items:
        if _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items.sort(key=_start_rank)


_GROUPS_LOST: Final = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note if ``--dist loadgroup`` lost its groups: pytest-xdist carries a test's group in
    its node id (``...::test@group``), and a pytest that ignores the rewrite (9.2 with xdist
    3.8, xdist issue #1386) would quietly start each module's engine once per test process
    and make the run minutes longer. Every test then fails saying so (``_groups_kept``)."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
    ]
    if lost:
        session.config.stash[_GROUPS_LOST] = (
            f"--dist loadgroup ignored the xdist_group of {len(lost)} tests (e.g. {lost[0]}): "
            "this pytest and pytest-xdist do not work together; see the pin of pytest in "
            "pyproject.toml"
        )


@pytest.fixture(autouse=True)
def _groups_kept(request: pytest.FixtureRequest) -> None:
    if (lost := request.config.stash.get(_GROUPS_LOST, None)) is not None:
        pytest.fail(lost, pytrace=False)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database for one test: SQLite, or PostgreSQL too where the test is marked
    ``both_databases``."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sluice.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def sluice_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


# Session fixtures of each real server live in their own module, tests/services_<name>.py;
# migrated databases copied from a per-session template in tests/db_templates.py.
pytest_plugins = [
    *sorted(f"tests.{p.stem}" for p in Path(__file__).parent.glob("services_*.py")),
    "tests.db_templates",
    "tests.reporting",
]
