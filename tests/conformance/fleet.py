"""The kit's fleet: ``sluice triggerer`` processes on one PostgreSQL database, one stream.

One fleet per broker and test process (the session fixture ``fleet``), reused by the
process cases in order: its database (a copy of the migrated template) holds the kit's DAG
file, parsed once in process (three watchers: kind a, kind b, every message), and an audit
of every asset-event insert; engines are started as the cases need them (``ready``) and
killed, stopped or frozen by the cases. Each engine connects with
``application_name=<engine name>``, and a BEFORE INSERT trigger on ``asset_event`` writes
that name into ``kit.audit``: a BEFORE trigger fires even for a row that ``ON CONFLICT DO
NOTHING`` then skips, and it rolls back with its transaction, so ``kit.audit`` holds every
committed attempt to store an event, by engine. The stream lives in an event loop of its own
(an anyio blocking portal), so the cases are plain functions.

Engines are triggerers only (the part the cases are about): no scheduler, executor, API or
DAG processor, which keeps a start under a second or two.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from cryptography.fernet import Fernet
from sqlalchemy import select, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Job, Trigger
from engine.states import TriggerKind
from engine.triggerer.settings import CLAIM_IDLE_INTERVAL_S
from tests.conformance.world import ABC, Stored, dag_file
from tests.e2e.helpers import log_records, sluice_env, start_cli, wait_for
from tests.integration.harness import parse_in_process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import ExitStack
    from pathlib import Path

    from anyio.from_thread import BlockingPortal

    from tests.conformance.broker import KitBroker, KitStream

HEARTBEAT_S: Final = 1.0
THRESHOLD_S: Final = 2.1 * HEARTBEAT_S
LOADED_MACHINE_MARGIN_S: Final = 2.0  # as tests/e2e/test_engine_ha.py
TAKEOVER_BOUND_S: Final = THRESHOLD_S + CLAIM_IDLE_INTERVAL_S + LOADED_MACHINE_MARGIN_S
CAPACITY: Final = 2  # three watchers of one key: a capacity that would split them
START_S: Final = 30.0
STOP_S: Final = 20.0

AUDIT_SQL: Final = (  # a schema of its own: the engine's schema check sees only its tables
    "CREATE SCHEMA kit",
    "CREATE TABLE kit.audit (id bigserial PRIMARY KEY, app text NOT NULL, dedup_key text)",
    """CREATE FUNCTION kit.audit_insert() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO kit.audit (app, dedup_key)
        VALUES (current_setting('application_name'), NEW.dedup_key);
        RETURN NEW;
    END $$""",
    "CREATE TRIGGER kit_audit BEFORE INSERT ON asset_event "
    "FOR EACH ROW EXECUTE FUNCTION kit.audit_insert()",
)


@dataclass
class Engine:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    job_id: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def records(self, *, after: int = 0) -> list[dict[str, Any]]:
        """Its JSON log records from byte ``after`` of the log on."""
        return list(_records_from(self.log, after))

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0


def _records_from(log: Path, offset: int) -> list[dict[str, Any]]:
    tail = log.parent / f".{log.name}.tail"
    with log.open("rb") as handle:
        handle.seek(offset)
        tail.write_bytes(handle.read())
    return log_records(tail)


@dataclass
class Fleet:
    kit: KitBroker
    stream: KitStream
    portal: BlockingPortal
    db: Database
    url: str
    tmp: Path
    fernet_key: str
    engines: list[Engine] = field(default_factory=list)
    published: int = 0

    # -- the stream, from this thread ---------------------------------------------------

    def publish(self, count: int) -> range:
        """The next ``count`` kit messages, on their lanes; their ``n``."""
        from tests.conformance.world import message

        ns = range(self.published, self.published + count)
        self.published += count
        for lane in range(self.stream.lanes):
            bodies = [message(n) for n in ns if n % self.stream.lanes == lane]
            self.portal.call(lambda b=bodies, ln=lane: self.stream.publish(b, lane=ln))
        return ns

    def unresolved(self) -> int:
        return int(self.portal.call(self.stream.unresolved))

    # -- engines --------------------------------------------------------------------------

    def start(self) -> Engine:
        """Start an engine and wait until its triggerer job runs."""
        engine = self.spawn()
        self.wait_started(engine)
        return engine

    def wait_started(self, engine: Engine) -> None:
        engine.job_id = wait_for(
            lambda: self._job_of(engine), timeout=START_S, what=f"{engine.name}'s triggerer job"
        )

    def spawn(self) -> Engine:
        name = f"kit-e{len(self.engines)}"
        env = sluice_env(
            self.tmp / name,
            SLUICE__CORE__SQL_ALCHEMY_CONN=f"{self.url}?application_name={name}",
            SLUICE__CORE__FERNET_KEY=self.fernet_key,
            SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC=str(HEARTBEAT_S),
            SLUICE__TRIGGERER__CAPACITY=str(CAPACITY),
            SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC="5",
        )
        log = self.tmp / f"{name}.log"
        proc = start_cli("--log-format", "json", "triggerer", env=env, log=log)
        engine = Engine(name, proc, log)
        self.engines.append(engine)
        return engine

    def _job_of(self, engine: Engine) -> int | None:
        assert engine.alive, f"{engine.name} exited:\n{engine.log.read_text()[-2000:]}"
        query = select(Job.id).where(Job.pid == engine.proc.pid, Job.state == "running")
        return self.db.call(lambda s: s.execute(query).scalar())

    def live(self) -> list[Engine]:
        return [e for e in self.engines if e.alive]

    def owners(self) -> dict[int, int | None]:
        """Watcher row -> its triggerer job."""
        query = select(Trigger.id, Trigger.triggerer_id).where(Trigger.kind == TriggerKind.WATCHER)
        return dict(self.db.call(lambda s: s.execute(query).all()))

    def owner(self) -> Engine | None:
        """The live engine that holds every watcher row (None: split or unclaimed)."""
        jobs = set(self.owners().values())
        if len(jobs) != 1:
            return None
        job = next(iter(jobs))
        if job is None:
            return None
        # by pid: a fenced triggerer starts again in its process under a new job
        pid = self.db.call(lambda s: s.execute(select(Job.pid).where(Job.id == job)).scalar())
        return next((e for e in self.live() if e.proc.pid == pid), None)

    def ready(self, count: int = 2) -> tuple[Engine, list[Engine]]:
        """``count`` live engines, one of which owns the whole group; (owner, the others)."""
        started = [self.spawn() for _ in range(count - len(self.live()))]  # start together
        for engine in started:
            self.wait_started(engine)
        owner = wait_for(self.owner, timeout=START_S, what="one live engine to own every watcher")
        return owner, [e for e in self.live() if e is not owner]

    def kill(self, engine: Engine) -> None:
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait()

    def stop_all(self) -> None:
        for engine in self.live():
            os.kill(engine.proc.pid, signal.SIGCONT)  # a frozen one must hear the SIGTERM
            engine.proc.send_signal(signal.SIGTERM)
        for engine in self.engines:
            try:
                engine.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                engine.proc.kill()
                engine.proc.wait()

    def tails(self) -> str:
        return "\n".join(f"--- {e.name}:\n{e.log.read_text()[-1500:]}" for e in self.engines)

    # -- the database -----------------------------------------------------------------------

    def stored(self) -> Stored:
        return Stored.read(self.db, self.kit)

    def audit(self, *, after_id: int = 0) -> list[tuple[int, str, str]]:
        sql = text("SELECT id, app, dedup_key FROM kit.audit WHERE id > :after ORDER BY id")
        return [tuple(r) for r in self.db.call(lambda s: s.execute(sql, {"after": after_id}).all())]

    def last_audit_id(self) -> int:
        sql = text("SELECT coalesce(max(id), 0) FROM kit.audit")
        return int(self.db.call(lambda s: s.execute(sql).scalar_one()))

    def waiting_on_a_lock(self, engine: Engine) -> bool:
        sql = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = :app AND wait_event_type = 'Lock'"
        )
        return bool(self.db.call(lambda s: s.execute(sql, {"app": engine.name}).scalar_one()))


def settle(fleet: Fleet, want: dict[str, set[int]], *, timeout: float = 40.0) -> bool:
    """Wait until every wanted event is stored and the broker holds nothing more."""

    def done() -> bool:
        return fleet.unresolved() == 0 and fleet.stored().has(want)

    try:
        wait_for(
            done, timeout=timeout, what="every message stored and the broker drained", step=0.2
        )
    except AssertionError:
        return False
    return True


def only(stored: Stored, ns: range) -> Stored:
    """``stored`` restricted to the messages ``ns`` (a case's own)."""
    keep = set(ns)
    out = Stored()
    for label, got in stored.ns.items():
        pairs = [(n, k) for n, k in zip(got, stored.keys[label], strict=True) if n in keep]
        out.ns[label] = [n for n, _ in pairs]
        out.keys[label] = [k for _, k in pairs]
    return out


def open_fleet(
    kit: KitBroker, portal: BlockingPortal, url: str, tmp: Path, stack: ExitStack
) -> Fleet:
    """The fleet's database (DAG parsed, audit installed) and stream; engines not started."""
    stream = stack.enter_context(portal.wrap_async_context_manager(kit.stream(lanes=2)))
    dags = tmp / "dags"
    dags.mkdir()
    watchers = {label: stream.watcher_source(match=k and {"kind": k}) for label, k in ABC.items()}
    (dags / "kit.py").write_text(dag_file("kit_fleet", stream.imports, watchers))
    key = Fernet.generate_key().decode()
    db = Database(url)
    stack.callback(db.dispose)
    report = parse_in_process(db, KwargsCipher(key), dags)
    assert not report.errors, report.errors
    db.call(lambda s: [s.execute(text(sql)) for sql in AUDIT_SQL])
    fleet = Fleet(kit, stream, portal, db, url, tmp, key)
    stack.callback(fleet.stop_all)
    return fleet


def monotonic_since(start: float) -> float:
    return time.monotonic() - start


def iter_actions(records: list[dict[str, Any]]) -> Iterator[str]:
    for record in records:
        if isinstance(action := record.get("action"), str):
            yield action
