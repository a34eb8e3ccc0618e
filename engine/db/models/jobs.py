"""The engine's own rows: its parts' jobs (heartbeats), the trigger rows triggerers claim
(kwargs stored only as a Fernet token, see ``engine.crypto``), and what each triggerer
publishes of its shared-stream groups (snapshots and a short history of samples).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from engine.db.models.base import Base, UtcDateTime, utcnow
from engine.states import JobState, TriggerKind


class Job(Base):
    """A running engine part (triggerer, scheduler, ...) and its heartbeat."""

    __tablename__ = "job"
    __table_args__ = (Index(None, "job_type", "state", "latest_heartbeat"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_type: Mapped[str] = mapped_column(String(30))
    state: Mapped[str] = mapped_column(String(20), default=JobState.RUNNING)
    hostname: Mapped[str] = mapped_column(String(500), default="")
    pid: Mapped[int | None] = mapped_column(Integer)
    capacity: Mapped[int | None] = mapped_column(Integer)
    start_date: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    end_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    latest_heartbeat: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    #: the Celery queues a `sluice celery worker` consumes, comma-separated (None for every
    #: other part)
    queues: Mapped[str | None] = mapped_column(String(2000))


class Trigger(Base):
    """A trigger to run: class path and Fernet-encrypted kwargs; owned by one triggerer."""

    __tablename__ = "trigger"
    # (digest, owner): who holds a group; (owner, digest): the groups one triggerer holds and
    # its unassigned single rows (owner NULL, digest NULL) without a scan of all rows.
    __table_args__ = (
        Index(None, "stream_digest", "triggerer_id"),
        Index(None, "triggerer_id", "stream_digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    classpath: Mapped[str] = mapped_column(String(1000))
    kwargs: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20), default=TriggerKind.TASK)
    created_date: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    triggerer_id: Mapped[int | None] = mapped_column(
        ForeignKey("job.id", ondelete="SET NULL"), index=True
    )
    failure_count: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_failure_date: Mapped[datetime | None] = mapped_column(UtcDateTime)
    #: Digest of the trigger's ``shared_stream_key()`` (None: it shares no stream, or the row
    #: was written before the digest existed and no triggerer has loaded it yet). Rows with
    #: one digest are claimed, held and moved as one group: one owner per key, fleet-wide.
    stream_digest: Mapped[str | None] = mapped_column(String(64))
    #: when its current triggerer claimed it (None while unclaimed)
    claimed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    #: Set when its last failure was an upstream it could not reach: what it reads
    #: (``shared_stream.keys.broker_kind``: "kafka", "rabbitmq", ... or the class name) and
    #: where (the address its error named; None when it named none). A failure of another
    #: kind clears both.
    unreachable_broker: Mapped[str | None] = mapped_column(String(100))
    unreachable_address: Mapped[str | None] = mapped_column(String(1000))


class SharedStreamSnapshot(Base):
    """The last published ``GroupStats`` of one shared-stream group of one triggerer.

    The triggerer rewrites its rows every heartbeat and deletes them when it stops, so
    ``sluice streams list`` can read every live triggerer's groups from the database.
    """

    __tablename__ = "shared_stream_snapshot"

    triggerer_id: Mapped[int] = mapped_column(
        ForeignKey("job.id", ondelete="CASCADE"), primary_key=True
    )
    stream_key: Mapped[str] = mapped_column(String(1000), primary_key=True)
    mode: Mapped[str] = mapped_column(String(10))
    subscribers: Mapped[int] = mapped_column(Integer, default=0)
    queue_high_water: Mapped[int] = mapped_column(Integer, default=0)
    outstanding_by_lane: Mapped[Any] = mapped_column(JSON, default=dict)
    oldest_unresolved_age_s: Mapped[float | None] = mapped_column(Float)
    events_polled: Mapped[int] = mapped_column(BigInteger, default=0)
    deliveries: Mapped[int] = mapped_column(BigInteger, default=0)
    advances: Mapped[int] = mapped_column(BigInteger, default=0)
    advanced_events: Mapped[int] = mapped_column(BigInteger, default=0)
    last_advance_batch: Mapped[int] = mapped_column(Integer, default=0)
    advance_latency_sum_s: Mapped[float] = mapped_column(Float, default=0.0)
    overflows: Mapped[int] = mapped_column(Integer, default=0)
    ack_timeouts: Mapped[int] = mapped_column(Integer, default=0)
    rejects: Mapped[int] = mapped_column(BigInteger, default=0)
    #: what the group reads (``shared_stream.keys.broker_kind``): "kafka", "sqs", ...
    broker: Mapped[str] = mapped_column(String(100), default="", server_default="")
    #: events advanced with a rejected outcome (the producer's dead-letter way)
    dead_lettered: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    #: lanes with events not advanced (``outstanding_by_lane`` names the busiest only)
    lanes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    #: the key's digest, as ``trigger.stream_digest`` holds it (None: the key has no stable
    #: digest); ties a watcher's trigger row to its group's snapshot
    stream_digest: Mapped[str | None] = mapped_column(String(64))


class SharedStreamSample(Base):
    """A short history of each shared-stream group: what its triggerer
    published at each heartbeat, the last ``SAMPLES_KEPT`` per group (triggerer and key: two
    triggerers may each run a group of one key), for the advance rate and the UI's sparkline
    (``engine.views.streams``). Counters are totals since the group started on that
    triggerer, so a rate is taken between samples of one triggerer only."""

    __tablename__ = "shared_stream_sample"
    __table_args__ = (Index(None, "triggerer_id", "stream_key", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    triggerer_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    stream_key: Mapped[str] = mapped_column(String(1000))
    sampled_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    outstanding: Mapped[int] = mapped_column(Integer, default=0)
    oldest_unresolved_age_s: Mapped[float | None] = mapped_column(Float)
    events_polled: Mapped[int] = mapped_column(BigInteger, default=0)
    advances: Mapped[int] = mapped_column(BigInteger, default=0)
    advanced_events: Mapped[int] = mapped_column(BigInteger, default=0)
