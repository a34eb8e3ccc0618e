"""A real engine for the browser tests: ``sluice run`` on the example DAGs of ``dags/``
with a fresh ``SLUICE_HOME`` and a copy of the migrated template database, the API/UI on a
free loopback port, and users made with ``sluice users create`` (one per role, a known
password; run in this process)."""

from __future__ import annotations

import contextlib
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Dag
from tests.cli import invoke
from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

REPO: Final = Path(__file__).resolve().parents[2]
EXAMPLE_DAGS: Final = REPO / "dags"
PASSWORD: Final = "a browser test password"
#: username -> role: one user per role.
USERS: Final = {"ada": "admin", "otto": "op", "vic": "viewer"}
PARSE_TIMEOUT_S: Final = 90.0  # eight example files parsed on a loaded 2-core machine


@dataclass(frozen=True)
class UiEngine:
    url: str  # http://127.0.0.1:PORT (no trailing slash)
    home: Path
    env: dict[str, str]
    db: Database
    log: Path

    def dag_ids(self) -> set[str]:
        return set(self.db.call(lambda s: s.execute(select(Dag.dag_id)).scalars().all()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_user(env: dict[str, str], username: str, role: str) -> None:
    done = invoke(
        *("users", "create", "--username", username, "--role", role, "--password-stdin"),
        env=env,
        input=PASSWORD + "\n",
    )
    assert done.returncode == 0, f"sluice users create {username}: {done.stdout}{done.stderr}"


def dags_folder(root: Path, examples: Iterable[str], extra: Mapping[str, str]) -> Path:
    """A dags folder in ``root`` with the example files ``examples`` (names in ``dags/``)
    and the files ``extra`` (name -> text, a DAG file that fails to parse, say)."""
    folder = root / "dags"
    folder.mkdir()
    for name in examples:
        shutil.copyfile(EXAMPLE_DAGS / name, folder / name)
    for name, text in extra.items():
        (folder / name).write_text(text)
    return folder


@contextlib.contextmanager
def running_ui_engine(
    root: Path, wanted: set[str], *, template: Path, dags: Path = EXAMPLE_DAGS
) -> Iterator[UiEngine]:
    """``sluice run`` in ``root`` on ``dags`` (the example DAGs; ``dags_folder`` makes
    another), its database a copy of the migrated ``template``, ready once the API answers
    and every DAG of ``wanted`` is parsed. Stopped with SIGTERM at the end (and must exit
    0)."""
    home = root / "home"
    home.mkdir()
    port = free_port()
    url = copy_sqlite_template(template, home / "sluice.db")
    env = engine_env(home, url=url, dags=dags, parallelism=4, SLUICE__API__PORT=str(port))
    for username, role in USERS.items():
        create_user(env, username, role)
    log = root / "engine.log"
    proc = start_engine(env, log)
    db = Database(url)
    engine = UiEngine(f"http://127.0.0.1:{port}", home, env, db, log)
    try:
        wait_for(
            lambda: engine.dag_ids() >= wanted,
            timeout=PARSE_TIMEOUT_S,
            what=f"the example DAGs {sorted(wanted)} to be parsed",
            step=0.2,
        )
        yield engine
    finally:
        code = stop(proc, timeout=60)
        db.dispose()
    assert code == 0, log.read_text(errors="replace")[-3000:]
