"""Claiming shared-stream groups on the real databases: one live owner per key, fleet-wide."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import delete, func, or_, select, update

from engine.db import models
from engine.db.database import Database
from engine.db.models import Job, Trigger
from engine.db.queries import claims as store_claims
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from engine.triggerer.triggerer import claiming
from engine.views import doctor as doctor_view

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

THRESHOLD_S = 30.0


class _PlainCipher:
    def encrypt_kwargs(self, kwargs, *, owner):
        return repr(sorted(kwargs.items()))


@pytest.fixture
def database(migrated_db_url: str):
    db = Database(migrated_db_url)
    yield db
    db.dispose()


def _add(db: Database, n: int, digest: str | None) -> list[int]:
    def add(session):
        return [
            trigger_rows.add_trigger_row(
                session,
                _PlainCipher(),
                "producers.kafka_trigger.KafkaMessageTrigger",
                {"i": i, "digest": digest},
                kind=TriggerKind.WATCHER,
                stream_digest=digest,
            )
            for i in range(n)
        ]

    return db.call(add)


def _job(db: Database, capacity: int) -> int:
    return db.call(lambda s: jobs_sql.start_job(s, job_type="triggerer", capacity=capacity))


def _claim(db: Database, job: int, left: int, now=None) -> claiming.ClaimResult:
    return db.call(
        lambda s: claiming.claim_round(
            s, triggerer_id=job, capacity_left=left, threshold_s=THRESHOLD_S, now=now
        )
    )


def _owners(db: Database, digest: str | None = None) -> dict[int, int | None]:
    query = select(Trigger.id, Trigger.triggerer_id)
    if digest is not None:
        query = query.where(Trigger.stream_digest == digest)
    return db.call(lambda s: {int(i): t for i, t in s.execute(query).all()})


def _stale(db: Database, job: int) -> None:
    old = models.utcnow() - timedelta(hours=1)
    db.call(lambda s: s.execute(update(Job).where(Job.id == job).values(latest_heartbeat=old)))


def test_a_group_is_claimed_whole_even_beyond_capacity(database: Database) -> None:
    """The defect of issue 13: capacity 2, four watchers of one key, two triggerers."""
    group = _add(database, 4, "g")
    a, b = _job(database, 2), _job(database, 2)
    got_a = _claim(database, a, 2)
    got_b = _claim(database, b, 2)
    assert [r.id for r in got_a.rows] == group
    assert [o.size for o in got_a.oversized] == [4]
    assert got_b.rows == []
    assert set(_owners(database).values()) == {a}


def test_a_group_that_does_not_fit_goes_to_a_triggerer_with_room(database: Database) -> None:
    single = _add(database, 1, None)
    group = _add(database, 3, "g")
    a, b = _job(database, 3), _job(database, 3)
    assert [r.id for r in _claim(database, a, 3).rows] == [*group]  # the group first: it fits
    assert [r.id for r in _claim(database, b, 3).rows] == single


def test_a_watcher_added_later_joins_its_owner_even_when_the_owner_is_full(
    database: Database,
) -> None:
    _add(database, 2, "g")
    a, b = _job(database, 2), _job(database, 100)
    assert len(_claim(database, a, 2).rows) == 2
    [late] = _add(database, 1, "g")

    def probe(job, has_room):
        return database.call(
            lambda s: store_claims.has_claimable_triggers(s, triggerer_id=job, has_room=has_room)
        )

    assert probe(b, True) is False  # B has room but the row belongs with A's group
    assert probe(a, False) is True  # A is full, yet the row is its to take
    assert _claim(database, b, 100).rows == []
    assert [r.id for r in _claim(database, a, 0).rows] == [late]
    assert probe(a, False) is False


def test_a_group_is_never_cut_to_a_rounds_size(database: Database) -> None:
    """Rooms are compared alike: a group bigger than the single-row limit of a round but
    within capacity goes to the first triggerer that claims (it starved before)."""
    group = _add(database, 5, "g")
    a, b = _job(database, 10), _job(database, 10)
    got = database.call(
        lambda s: claiming.claim_round(
            s, triggerer_id=a, capacity_left=10, single_limit=3, threshold_s=THRESHOLD_S
        )
    )
    assert [r.id for r in got.rows] == group
    assert got.oversized == []
    assert _claim(database, b, 10).rows == []


def test_a_stopping_triggerer_has_no_room(database: Database) -> None:
    group = _add(database, 4, "g")
    a, b = _job(database, 3), _job(database, 10)
    database.call(lambda s: jobs_sql.set_job_capacity(s, b, 0))  # B drains: takes no more
    got = _claim(database, a, 3)
    assert [r.id for r in got.rows] == group  # A has the most room left: over capacity
    assert [o.size for o in got.oversized] == [4]


def test_takeover_moves_the_whole_group(database: Database) -> None:
    group = _add(database, 3, "g")
    single = _add(database, 1, None)
    dead, alive = _job(database, 10), _job(database, 10)
    assert len(_claim(database, dead, 10).rows) == 4
    assert _claim(database, alive, 10).rows == []
    _stale(database, dead)
    taken = _claim(database, alive, 10)
    assert sorted(r.id for r in taken.rows) == sorted(group + single)
    assert set(_owners(database).values()) == {alive}


def test_a_split_group_is_repaired_to_the_holder_of_most_rows(database: Database) -> None:
    group = _add(database, 4, "g")
    a, b = _job(database, 10), _job(database, 10)
    _claim(database, a, 10)
    # A triggerer of an older version (or a hand edit) took one row of A's group.
    database.call(
        lambda s: s.execute(update(Trigger).where(Trigger.id == group[0]).values(triggerer_id=b))
    )
    splits = database.call(lambda s: store_claims.stream_splits(s, alive={a, b}))
    assert splits == {"g": {a: 3, b: 1}}
    facts = database.call(
        lambda s: doctor_view.doctor_facts(
            s, now=models.utcnow(), thresholds={}, default_threshold_s=THRESHOLD_S
        )
    )
    assert facts["stream_splits"] == [
        {"digest": "g", "holders": {a: 3, b: 1}, "trigger_ids": group}
    ]
    assert _claim(database, a, 10).released == []  # A is the designated owner: keeps its rows
    repaired = _claim(database, b, 10)
    assert repaired.released == [group[0]]
    assert repaired.rows == []
    assert [r.id for r in _claim(database, a, 10).rows] == [group[0]]
    assert set(_owners(database, "g").values()) == {a}
    assert database.call(lambda s: store_claims.stream_splits(s, alive={a, b})) == {}


def test_concurrent_claims_never_split_a_group(database: Database) -> None:
    """Four triggerers claim at once, over and over (PostgreSQL: real concurrency)."""
    digests = [f"g{i}" for i in range(12)]
    for digest in digests:
        _add(database, 3, digest)
    _add(database, 20, None)
    jobs = [_job(database, 8) for _ in range(4)]
    barrier = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def work(job: int) -> None:
        try:
            for round_ in range(6):
                barrier.wait(timeout=30)
                _claim(database, job, 8)
                if round_ % 2 == 1 and job == jobs[round_ % len(jobs)]:
                    database.call(lambda s: trigger_rows.release_triggers(s, triggerer_id=job))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    holders = database.call(lambda s: store_claims.group_holders(s, digests=None, alive=set(jobs)))
    assert set(holders) <= set(digests)
    assert all(len(held) == 1 for held in holders.values()), holders


# --- a model of the fleet: random claims, heartbeats, deaths, new rows --------------------


class FleetMachine(RuleBasedStateMachine):
    """No key is ever held by two live triggerers, whatever the interleaving."""

    def __init__(self) -> None:
        super().__init__()
        self.db: Database | None = None
        self.now = models.utcnow()
        self.jobs: dict[int, int] = {}  # live-or-stalled triggerer -> capacity
        self.stopped: set[int] = set()

    @initialize(n=st.integers(2, 5))
    def start(self, n) -> None:
        self.db = Database(FleetMachine.url)
        # One database serves every example: start each from an empty fleet.
        self.db.call(lambda s: (s.execute(delete(Trigger)), s.execute(delete(Job))))
        for _ in range(n):
            self._start_triggerer(capacity=3)

    def _start_triggerer(self, capacity: int) -> None:
        assert self.db is not None
        job = self.db.call(lambda s: jobs_sql.start_job(s, job_type="triggerer", capacity=capacity))
        self._beat(job)
        self.jobs[job] = capacity

    def _beat(self, job: int) -> None:
        assert self.db is not None
        now = self.now
        self.db.call(
            lambda s: s.execute(update(Job).where(Job.id == job).values(latest_heartbeat=now))
        )

    def _live(self) -> set[int]:
        assert self.db is not None
        return set(
            self.db.call(
                lambda s: jobs_sql.alive_job_ids(
                    s, job_type="triggerer", threshold_s=THRESHOLD_S, now=self.now
                )
            )
        )

    @rule(digest=st.sampled_from(["a", "b", "c", None]), n=st.integers(1, 4))
    def add_rows(self, digest, n) -> None:
        assert self.db is not None
        _add(self.db, n, digest)

    @rule(data=st.data())
    def claim(self, data) -> None:
        assert self.db is not None
        running = sorted(set(self.jobs) - self.stopped)
        if not running:
            return
        job = data.draw(st.sampled_from(running))
        held = len(self.db.call(lambda s: trigger_rows.owned_trigger_ids(s, triggerer_id=job)))
        _claim(self.db, job, max(0, self.jobs[job] - held), now=self.now)

    @rule(data=st.data())
    def heartbeat(self, data) -> None:
        running = sorted(set(self.jobs) - self.stopped)
        if running:
            self._beat(data.draw(st.sampled_from(running)))

    @rule(seconds=st.sampled_from([1.0, 10.0, THRESHOLD_S + 1]))
    def time_passes(self, seconds) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(data=st.data(), clean=st.booleans())
    def stop(self, data, clean) -> None:
        """A triggerer stops: cleanly (releases its rows) or killed (stops heartbeating)."""
        assert self.db is not None
        running = sorted(set(self.jobs) - self.stopped)
        if len(running) <= 1:
            return
        job = data.draw(st.sampled_from(running))
        self.stopped.add(job)
        if clean:
            self.db.call(lambda s: trigger_rows.release_triggers(s, triggerer_id=job))
            self.db.call(lambda s: jobs_sql.end_job(s, job))

    @rule()
    def new_triggerer(self) -> None:
        if len(set(self.jobs) - self.stopped) < 5:
            self._start_triggerer(capacity=2)

    @rule()
    def settle(self) -> None:
        """Killed triggerers go stale, every live one claims, twice over: then no row may
        wait while a live triggerer has room (a group never waits for one that could)."""
        assert self.db is not None
        # Long enough for killed triggerers to be seen dead; the running ones heartbeat.
        self.now += timedelta(seconds=THRESHOLD_S + 1)
        for job in set(self.jobs) - self.stopped:
            self._beat(job)
        live = sorted(self._live())
        assert not set(live) & self.stopped
        for _ in range(2):
            for job in live:
                held = len(
                    self.db.call(lambda s, j=job: trigger_rows.owned_trigger_ids(s, triggerer_id=j))
                )
                _claim(self.db, job, max(0, self.jobs[job] - held), now=self.now)
        waiting = self.db.call(
            lambda s: s.execute(
                select(func.count(Trigger.id)).where(
                    or_(Trigger.triggerer_id.is_(None), Trigger.triggerer_id.not_in(live))
                )
            ).scalar_one()
        )
        if waiting and live:
            rooms = {
                job: self.jobs[job]
                - len(
                    self.db.call(lambda s, j=job: trigger_rows.owned_trigger_ids(s, triggerer_id=j))
                )
                for job in live
            }
            assert all(room <= 0 for room in rooms.values()), (waiting, rooms)

    @invariant()
    def one_live_owner_per_key(self) -> None:
        if self.db is None:
            return
        live = self._live()
        holders = self.db.call(lambda s: store_claims.group_holders(s, digests=None, alive=live))
        split = {d: h for d, h in holders.items() if len(h) > 1}
        assert not split, f"keys held by several live triggerers: {split}"

    def teardown(self) -> None:
        if self.db is not None:
            self.db.dispose()


def test_fleet_model_never_serves_a_key_twice(migrated_db_url: str) -> None:
    FleetMachine.url = migrated_db_url
    # The database is shared by every example; each example adds its own jobs and rows, and
    # the invariant concerns live jobs only, so earlier examples' rows are just more state.
    machine_settings = settings(
        max_examples=25,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    FleetMachine.TestCase.settings = machine_settings
    FleetMachine.TestCase().runTest()
