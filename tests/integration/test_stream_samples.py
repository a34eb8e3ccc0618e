"""What migration 0015 keeps on the real databases: a bounded history of each shared-stream
group (written with the snapshots), and when a trigger row was claimed."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import SharedStreamSample, Trigger, utcnow
from engine.db.queries import claims, streams
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from engine.views.streams import advance_rate
from shared_stream import GroupStats

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]


class _PlainCipher:
    def encrypt_kwargs(self, kwargs, *, owner):
        return repr(sorted(kwargs.items()))


@pytest.fixture
def database(migrated_db_url: str):
    db = Database(migrated_db_url)
    yield db
    db.dispose()


def _samples(db: Database) -> dict[str, list[int]]:
    return {key: advanced for (_, key), advanced in _group_samples(db).items()}


def _group_samples(db: Database) -> dict[tuple[int, str], list[int]]:
    rows = db.call(
        lambda s: s.execute(
            select(
                SharedStreamSample.triggerer_id,
                SharedStreamSample.stream_key,
                SharedStreamSample.advanced_events,
            ).order_by(SharedStreamSample.id)
        ).all()
    )
    out: dict[tuple[int, str], list[int]] = {}
    for triggerer_id, key, advanced in rows:
        out.setdefault((triggerer_id, key), []).append(advanced)
    return out


def _publish(db: Database, triggerer_id: int, key: str, advanced: int, when: datetime) -> None:
    stats = [GroupStats(key=key, mode="ack", subscribers=1, advanced_events=advanced)]
    db.call(
        lambda s: streams.publish_stream_stats(s, triggerer_id=triggerer_id, stats=stats, now=when)
    )


def test_each_group_keeps_its_last_samples(database: Database) -> None:
    one = database.call(lambda s: jobs_sql.start_job(s, job_type=jobs_sql.TRIGGERER_JOB))
    two = database.call(lambda s: jobs_sql.start_job(s, job_type=jobs_sql.TRIGGERER_JOB))
    start = utcnow()
    for i in range(streams.SAMPLES_KEPT + 5):
        stats = [GroupStats(key="a", mode="ack", subscribers=1, advanced_events=i)]
        when = start + timedelta(seconds=i)
        database.call(
            lambda s, stats=stats, when=when: streams.publish_stream_stats(
                s, triggerer_id=one, stats=stats, now=when
            )
        )
    for i in range(3):
        stats = [GroupStats(key="b", mode="fast", subscribers=2, advanced_events=100 + i)]
        database.call(
            lambda s, stats=stats: streams.publish_stream_stats(
                s, triggerer_id=two, stats=stats, now=start
            )
        )
    kept = _samples(database)
    assert kept["a"] == list(range(5, streams.SAMPLES_KEPT + 5))  # the newest, in order
    assert kept["b"] == [100, 101, 102]
    groups = [(one, "a"), (two, "b"), (one, "c"), (two, "a")]
    newest = database.call(lambda s: streams.stream_samples(s, groups))
    assert [x.advanced_events for x in newest[one, "a"]][-1] == streams.SAMPLES_KEPT + 4
    assert set(newest) == {(one, "a"), (two, "b")}
    # a triggerer that stops deletes its snapshot rows; the history stays
    database.call(lambda s: streams.delete_stream_snapshots(s, triggerer_id=one))
    assert len(_samples(database)["a"]) == streams.SAMPLES_KEPT
    later = start + timedelta(seconds=streams.SAMPLE_RETENTION_S + 30)
    deleted = database.call(lambda s: streams.delete_old_stream_samples(s, now=later))
    assert deleted == 3 + 25  # b's, and a's older than the retention
    assert (
        database.call(
            lambda s: s.execute(select(func.count()).select_from(SharedStreamSample)).scalar_one()
        )
        == streams.SAMPLES_KEPT - 25
    )


def test_a_claim_records_when_and_a_release_clears_it(database: Database) -> None:
    def add(session):
        return trigger_rows.add_trigger_row(
            session, _PlainCipher(), "triggers.file.FileTrigger", {}, kind=TriggerKind.WATCHER
        )

    trigger_id = database.call(add)
    job = database.call(lambda s: jobs_sql.start_job(s, job_type=jobs_sql.TRIGGERER_JOB))
    live = claims.Liveness(alive=frozenset({job}))

    def claimed_at():
        return database.call(lambda s: s.get(Trigger, trigger_id).claimed_at)

    assert claimed_at() is None
    before = utcnow()
    database.call(lambda s: claims.assign_rows(s, [trigger_id], triggerer_id=job, live=live))
    first = claimed_at()
    assert first is not None and before - timedelta(seconds=1) <= first <= utcnow()
    # the owner claiming its own row again keeps the first time
    database.call(lambda s: claims.assign_rows(s, [trigger_id], triggerer_id=job, live=live))
    assert claimed_at() == first
    database.call(lambda s: trigger_rows.release_triggers(s, triggerer_id=job))
    assert claimed_at() is None


def test_two_triggerers_with_groups_of_one_key_keep_separate_histories(
    database: Database,
) -> None:
    """Each triggerer runs its own group of a key (its triggers of that stream): their
    samples are trimmed and read per group, so neither pushes out the other's history nor
    mixes its counters into the other's rate."""
    one = database.call(lambda s: jobs_sql.start_job(s, job_type=jobs_sql.TRIGGERER_JOB))
    two = database.call(lambda s: jobs_sql.start_job(s, job_type=jobs_sql.TRIGGERER_JOB))
    start = utcnow()
    for i in range(streams.SAMPLES_KEPT):
        _publish(database, one, "shared", 10 * i, start + timedelta(seconds=i))
    for i in range(3):
        _publish(database, two, "shared", 1000 + i, start + timedelta(seconds=i))
    kept = _group_samples(database)
    assert kept[one, "shared"] == [10 * i for i in range(streams.SAMPLES_KEPT)]
    assert kept[two, "shared"] == [1000, 1001, 1002]
    read = database.call(lambda s: streams.stream_samples(s, [(one, "shared"), (two, "shared")]))
    assert [x.triggerer_id for x in read[one, "shared"]] == [one] * streams.SAMPLES_KEPT
    assert [x.advanced_events for x in read[two, "shared"]] == [1000, 1001, 1002]
    assert advance_rate(read[one, "shared"]) == pytest.approx(10.0)
    assert advance_rate(read[two, "shared"]) == pytest.approx(1.0)
