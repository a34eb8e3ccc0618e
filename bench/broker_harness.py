"""What the broker benches share: N watchers through the real triggerer vs a bare client loop.

A broker's bench (``sqs_bench.py``, ``rabbitmq_bench.py``, ``redis_bench.py``,
``nats_bench.py``, ``mqtt_bench.py``) keeps only what is its broker's own, as a
``BrokerBench``: how M messages are preloaded into a fresh queue (stream, session) and
removed afterwards, the bare consume + ack loop, the watcher's trigger on that source, and
how it reads that every message is acked. This module runs the rest the same way for all:

* a fresh database per case: a SQLite file in a temporary folder, or a database created on
  the PostgreSQL server of ``--pg`` and dropped after;
* the real ``Triggerer`` in-process with N watchers (``capacity=100``, a 0.5 s cohort grace
  so that all N watchers see every message), timed from the producer's ``<kind>.connected``
  record until all M x N asset events are committed and the broker's acks are all in;
* each case (SQLite and PostgreSQL, N = 1 and 10) alternating with the bare loop
  ``--repeat`` times so that both see the same load; min / median / max of each figure and
  the ratio of the medians of the same run;
* the printed table and ``results/<kind>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, insert, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from contextlib import AbstractAsyncContextManager, AbstractContextManager

    from engine.triggerer.persister import BatchResult
    from triggers.base import BaseEventTrigger

COHORT_GRACE_S = 0.5
WATCHER_COUNTS = (1, 10)
#: a bound on one run through the triggerer (a stuck run fails instead of hanging the bench)
RUN_TIMEOUT_S = 300.0
RESULTS = Path(__file__).resolve().parent / "results"


class BrokerBench(ABC):
    """One broker's own parts of the bench; the harness does the rest."""

    #: ``sqs``: the producer's logger ``producers.sqs`` and its ``sqs.connected`` record,
    #: ``results/sqs.json``, the PostgreSQL database ``sqs_bench_<hex>``
    kind: str
    #: how often the end of a run polls ``all_acked``
    ack_poll_s: float = 0.01

    @property
    @abstractmethod
    def where(self) -> str:
        """The broker, as the printed header names it."""

    @abstractmethod
    def preloaded(self, messages: int) -> AbstractAsyncContextManager[Any]:
        """A fresh source holding ``messages`` JSON messages, removed on exit."""

    @abstractmethod
    def watcher(self, source: Any) -> BaseEventTrigger:
        """The trigger of one watcher on ``source`` (no filter)."""

    @abstractmethod
    async def all_acked(self, source: Any, triggerer: Triggerer, messages: int) -> bool:
        """Whether every message of ``source`` is acked (after the last asset event)."""

    @abstractmethod
    async def bare_loop(self, messages: int) -> float:
        """Seconds the broker's own client takes to consume and ack ``messages`` messages."""


@dataclass(frozen=True, slots=True)
class Run:
    seconds: float
    msgs_per_s: float
    events_per_s: float


# -- the databases ----------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_database(admin_url: str, prefix: str) -> Iterator[str]:
    """The URL of a fresh database on the server of ``admin_url``, dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextlib.contextmanager
def fresh_database(backend: str, pg: str | None, kind: str) -> Iterator[str]:
    """A fresh SQLite file or PostgreSQL database for one case (``backend``)."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/q.db"
        return
    assert pg is not None
    with postgres_database(pg, f"{kind}_bench") as url:
        yield url


def seed(db: Database, cipher: KwargsCipher, triggers: Sequence[BaseEventTrigger]) -> None:
    """One asset and one watcher per trigger."""

    def insert_rows(session: Any) -> None:
        for i, trigger in enumerate(triggers):
            asset_id = session.execute(
                insert(Asset)
                .values(name=f"a{i}", uri=f"bench://a{i}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(insert_rows)


# -- through the triggerer --------------------------------------------------------------------


class _ConnectedAt(logging.Handler):
    """Records when the producer logged its ``action`` (it consumes from then on)."""

    def __init__(self, action: str) -> None:
        super().__init__()
        self.action = action
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == self.action and self.at is None:
            self.at = time.perf_counter()


@contextlib.contextmanager
def _connected_at(kind: str) -> Iterator[_ConnectedAt]:
    handler = _ConnectedAt(f"{kind}.connected")
    producer_logger = logging.getLogger(f"producers.{kind}")
    producer_logger.addHandler(handler)
    producer_logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        producer_logger.removeHandler(handler)


class _Committed:
    """Counts the asset events the triggerer commits; ``done`` once ``expected`` are in."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.done = anyio.Event()

    def __call__(self, result: BatchResult) -> None:
        self.count += result.asset_events
        if self.count >= self.expected:
            self.done.set()


async def _run_until_acked(
    bench: BrokerBench, source: Any, triggerer: Triggerer, committed: _Committed, messages: int
) -> float:
    """Run ``triggerer`` until every asset event is committed and every message acked."""
    with anyio.fail_after(RUN_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await committed.done.wait()
            # the last acks follow the last commit within milliseconds; they are read from
            # the broker (or the producer), which signals nothing: poll
            while not await bench.all_acked(source, triggerer, messages):  # noqa: ASYNC110
                await anyio.sleep(bench.ack_poll_s)
            finished = time.perf_counter()
            triggerer.shutdown()
    return finished


async def through_triggerer(bench: BrokerBench, db_url: str, messages: int, watchers: int) -> Run:
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    committed = _Committed(messages * watchers)
    settings = TriggererSettings(
        capacity=100,
        heartbeat_s=5,
        claim_idle_interval_s=0.05,
        cohort_grace_period_s=COHORT_GRACE_S,
    )
    try:
        with _connected_at(bench.kind) as connected:
            async with bench.preloaded(messages) as source:
                seed(db, cipher, [bench.watcher(source) for _ in range(watchers)])
                triggerer = Triggerer(
                    db=db, cipher=cipher, settings=settings, on_committed=committed
                )
                finished = await _run_until_acked(bench, source, triggerer, committed, messages)
    finally:
        db.dispose()
    assert committed.count == committed.expected, (
        f"{committed.count} asset events, expected {committed.expected}"
    )
    assert connected.at is not None
    seconds = finished - connected.at
    return Run(seconds, messages / seconds, committed.expected / seconds)


# -- the cases --------------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


async def _case(
    bench: BrokerBench, messages: int, backend: str, watchers: int, pg: str | None
) -> Run:
    with fresh_database(backend, pg, bench.kind) as db_url:
        return await through_triggerer(bench, db_url, messages, watchers)


async def run_all(
    bench: BrokerBench, messages: int, pg: str | None, repeat: int
) -> dict[str, dict[str, Any]]:
    """Each case alternates with the bare loop ``repeat`` times (same load for both)."""
    backends = ["sqlite"] + (["postgres"] if pg else [])
    results: dict[str, dict[str, Any]] = {}
    for backend in backends:
        for watchers in WATCHER_COUNTS:
            bare, ours, events = [], [], []
            for _ in range(repeat):
                bare.append(messages / await bench.bare_loop(messages))
                run = await _case(bench, messages, backend, watchers, pg)
                ours.append(run.msgs_per_s)
                events.append(run.events_per_s)
            results[f"{backend}_n{watchers}"] = {
                "watchers": watchers,
                "msgs_per_s": _spread(ours),
                "events_per_s": _spread(events),
                "bare_msgs_per_s": _spread(bare),
                "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
            }
    return results


# -- the command line -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    """A broker's own command-line option (``--url``, ``--servers``)."""

    flag: str
    default: str
    help: str


def parse_args(
    doc: str | None,
    options: Sequence[Option] = (),
    *,
    default_messages: int = 2000,
    unit: str = "messages",
    min_repeat: int = 3,
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=default_messages, help=f"{unit} per case")
    for option in options:
        parser.add_argument(option.flag, default=option.default, help=option.help)
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a db per case)")
    spread = " (>= 3)" if min_repeat >= 3 else ""
    parser.add_argument("--repeat", type=int, default=3, help=f"repetitions per figure{spread}")
    parser.add_argument("--out", default=None, help="results file (default results/<kind>.json)")
    args = parser.parse_args()
    if args.repeat < min_repeat:
        if min_repeat >= 3:
            parser.error("--repeat must be at least 3 (min/median/max of >= 3 runs)")
        parser.error(f"--repeat must be at least {min_repeat}")
    return args


def report(
    bench: BrokerBench,
    results: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    load: Sequence[float],
    unit: str = "messages",
) -> None:
    """The printed table, and the results document."""
    print(f"{args.messages} {unit} per case, {bench.where}, x{args.repeat}")
    for name, fig in results.items():
        ours, bare, events = fig["msgs_per_s"], fig["bare_msgs_per_s"], fig["events_per_s"]
        print(
            f"{name:12s} {ours['median']:8.0f} msgs/s [{ours['min']:.0f}..{ours['max']:.0f}]  "
            f"{events['median']:8.0f} asset events/s   bare loop {bare['median']:.0f} "
            f"[{bare['min']:.0f}..{bare['max']:.0f}]  ratio {fig['ratio_of_medians']:.2f}"
        )
    out = Path(args.out) if args.out else RESULTS / f"{bench.kind}.json"
    machine = {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load]}
    document = {"messages": args.messages, "repetitions": args.repeat, "machine": machine}
    out.write_text(json.dumps({**document, **results}, indent=2) + "\n")
    print(f"written {out}")


def main(
    doc: str | None,
    open_bench: Callable[[argparse.Namespace], AbstractContextManager[BrokerBench]],
    options: Sequence[Option] = (),
    *,
    default_messages: int = 2000,
    unit: str = "messages",
    min_repeat: int = 3,
) -> None:
    """A broker bench's command: ``open_bench(args)`` yields the bench (and its broker)."""
    args = parse_args(
        doc, options, default_messages=default_messages, unit=unit, min_repeat=min_repeat
    )
    with open_bench(args) as bench:
        load = os.getloadavg()
        results = anyio.run(run_all, bench, args.messages, args.pg, args.repeat)
    report(bench, results, args, load, unit)
