"""The entries of ``engine.views.why`` for the assets and aliases of a DAG's schedule:
each watcher's state in words (``status`` and ``problem``), each asset's and alias's
updaters (watchers, producing tasks) and what keeps it from being updated (``cause``).

Pure: the facts read by ``engine.db.queries.why`` / ``why_watchers`` in, records
(``why_records``) out; ``now`` is a parameter. A watcher's status, the first that applies:

- ``load_failed``: the triggerer cannot load its trigger (class, kwargs, Fernet key);
- ``unclaimed``: no triggerer holds its trigger row (none alive, or all full);
- ``owner_dead``: the triggerer holding it stopped heartbeating;
- ``failing``: it failed in the last ``FAILING_WATCHER_WINDOW_S`` with no event since (a
  broker that is down: the triggerer restarts it with backoff); when that failure was an
  upstream it could not reach, the triggerer recorded what and where (the trigger row's
  ``unreachable_broker`` and ``unreachable_address``), and the problem says so: "cannot
  reach its RabbitMQ broker at 127.0.0.1:5672";
- ``ok``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from engine.db.queries.jobs import age_s
from engine.db.queries.triggers import LOAD_FAILURE_PREFIX
from engine.states import JobState, TaskState
from engine.views.common import iso
from engine.views.doctor import FAILING_WATCHER_WINDOW_S

if TYPE_CHECKING:
    from datetime import datetime

    from engine.db.models import SharedStreamSnapshot
    from engine.db.queries.why import AssetFacts, ProducerFacts, QueuedEvents
    from engine.db.queries.why_watchers import EngineFacts, StreamGroupFacts, WatcherFacts
    from engine.views.why_records import (
        AliasEntry,
        AssetEntry,
        Owner,
        Producer,
        Queued,
        SharedStream,
        Snapshot,
        Unreachable,
        Watcher,
        WatcherStatus,
    )

_START_TRIGGERER: Final = "start one: `sluice triggerer` or `sluice run`"
_FAILED: Final = (TaskState.FAILED, TaskState.UPSTREAM_FAILED)


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True, slots=True)
class WatcherContext:
    now: datetime
    threshold_s: float  # heartbeat age after which a triggerer is dead
    engine: EngineFacts
    groups: dict[str, StreamGroupFacts]


# --- watchers, assets, aliases ------------------------------------------------------------


def watcher_entry(w: WatcherFacts, ctx: WatcherContext) -> Watcher:
    owner: Owner | None = None
    if w.owner is not None:
        age = round(max((ctx.now - w.owner.latest_heartbeat).total_seconds(), 0.0), 3)
        owner = {
            "id": w.owner.id,
            "hostname": w.owner.hostname,
            "pid": w.owner.pid,
            "state": w.owner.state,
            "alive": w.owner.state == JobState.RUNNING and age < ctx.threshold_s,
            "heartbeat_age_s": age,
        }
    status, problem = _watcher_status(w, owner, ctx)
    return {
        "name": w.name,
        "trigger_id": w.trigger_id,
        "classpath": w.classpath,
        "claimed": w.triggerer_id is not None,
        "triggerer_id": w.triggerer_id,
        "owner": owner,
        "last_event_at": iso(w.last_event_at),
        "failures": w.failure_count,
        "last_error": w.last_error,
        "last_failure_at": iso(w.last_failure_at),
        "load_failed": _load_failed(w),
        "unreachable": _unreachable(w),
        "shared_stream": _stream(w, ctx),
        "status": status,
        "problem": problem,
    }


def _load_failed(w: WatcherFacts) -> bool:
    return bool(w.last_error and w.last_error.startswith(LOAD_FAILURE_PREFIX))


def _watcher_status(
    w: WatcherFacts, owner: Owner | None, ctx: WatcherContext
) -> tuple[WatcherStatus, str | None]:
    """(status, what is wrong as a predicate: "is not claimed: ...") of one watcher."""
    engine = ctx.engine
    if _load_failed(w):
        return "load_failed", f"cannot be loaded: {first_line(w.last_error)}"
    if w.triggerer_id is None:
        if not engine.triggerers_alive:
            return "unclaimed", f"is not claimed: no live triggerer ({_START_TRIGGERER})"
        room = ""
        if engine.triggerer_capacity is not None:
            room = f"; they hold {engine.triggers_held} of {engine.triggerer_capacity} triggers"
            if engine.triggers_held >= engine.triggerer_capacity:
                room += ": full, raise [triggerer] capacity or start another"
            else:
                room += " and claim new ones within seconds"
        alive = engine.triggerers_alive
        return "unclaimed", f"is not claimed although {alive} triggerer(s) are alive{room}"
    if owner is None or not owner["alive"]:
        host = "" if owner is None or not owner["hostname"] else f" on {owner['hostname']}"
        dead = "gone" if owner is None else f"last heartbeat {owner['heartbeat_age_s']:.0f}s ago"
        takeover = (
            "a live triggerer takes it over at its next claim"
            if engine.triggerers_alive
            else f"no live triggerer takes it over ({_START_TRIGGERER})"
        )
        return (
            "owner_dead",
            f"is held by triggerer {w.triggerer_id}{host}, dead ({dead}); {takeover}",
        )
    if _is_failing(w, ctx.now):
        at = iso(w.last_failure_at)
        failed = f"failed {w.failure_count} time(s), last at {at}"
        if w.unreachable_broker is not None:
            where = f" at {w.unreachable_address}" if w.unreachable_address else ""
            return (
                "failing",
                f"cannot reach its {broker_name(w.unreachable_broker)} broker{where} "
                f"({failed}; the triggerer retries with a backoff): {first_line(w.last_error)}",
            )
        return "failing", f"{failed}: {first_line(w.last_error)}"
    return "ok", None


#: How a broker kind (``shared_stream.keys.broker_kind``) is written in a sentence; a kind
#: not listed (a class name, a plugin's own kind) is written as it is.
BROKER_NAMES: Final = {
    "kafka": "Kafka",
    "sqs": "SQS",
    "rabbitmq": "RabbitMQ",
    "redis": "Redis",
    "nats": "NATS",
    "mqtt": "MQTT",
}


def broker_name(kind: str) -> str:
    """``kafka`` -> ``Kafka``; an unknown kind as it is."""
    return BROKER_NAMES.get(kind, kind)


def _unreachable(w: WatcherFacts) -> Unreachable | None:
    if w.unreachable_broker is None:
        return None
    return {
        "broker": w.unreachable_broker,
        "broker_name": broker_name(w.unreachable_broker),
        "address": w.unreachable_address,
    }


def _is_failing(w: WatcherFacts, now: datetime) -> bool:
    """Failed lately (a watcher that keeps failing restarts within the window) with no
    event since."""
    failed = w.last_failure_at
    if failed is None or (now - failed).total_seconds() > FAILING_WATCHER_WINDOW_S:
        return False
    return w.last_event_at is None or w.last_event_at < failed


def _stream(w: WatcherFacts, ctx: WatcherContext) -> SharedStream | None:
    group = ctx.groups.get(w.stream_digest) if w.stream_digest else None
    if group is None:
        return None
    mine = [s for s in group.snapshots if s.triggerer_id == w.triggerer_id]
    return {
        "digest": group.digest,
        "triggers": len(group.trigger_ids),
        "holders": group.holders,
        "split": len(group.holders) > 1,
        "snapshot": _snapshot(mine[0], ctx.now) if mine else None,
    }


def _snapshot(snap: SharedStreamSnapshot, now: datetime) -> Snapshot:
    lanes = dict(snap.outstanding_by_lane or {})
    return {
        "triggerer_id": snap.triggerer_id,
        "key": snap.stream_key,
        "broker": snap.broker,
        "mode": snap.mode,
        "subscribers": snap.subscribers,
        "outstanding_events": sum(int(n) for n in lanes.values()),
        "outstanding_by_lane": lanes,
        "oldest_unresolved_age_s": snap.oldest_unresolved_age_s,
        "advances": snap.advances,
        "overflows": snap.overflows,
        "ack_timeouts": snap.ack_timeouts,
        "dead_lettered": snap.dead_lettered,
        "snapshot_age_s": age_s(now, snap.updated_at),
    }


def queued_entry(queued: QueuedEvents | None) -> Queued:
    if queued is None:
        return {"count": 0, "last_event_at": None, "sources": {}}
    return {
        "count": queued.count,
        "last_event_at": iso(queued.last_at),
        "sources": dict(sorted(queued.by_source.items())),
    }


def producer_entry(p: ProducerFacts) -> Producer:
    return {
        "dag_id": p.dag_id,
        "task_id": p.task_id,
        "dag_paused": p.dag_paused,
        "outlets": p.outlets,
        "outlet_aliases": p.outlet_aliases,
        "last_state": p.last_state,
        "last_run_id": p.last_run_id,
        "last_end": iso(p.last_end),
    }


def asset_entry(
    name: str,
    facts: AssetFacts | None,
    queued: QueuedEvents | None,
    *,
    satisfied: bool,
    watchers: list[WatcherFacts],
    producers: list[ProducerFacts],
    context: WatcherContext,
) -> AssetEntry:
    watcher_entries = [watcher_entry(w, context) for w in watchers]
    producer_entries = [producer_entry(p) for p in producers]
    cause: str | None = "it is not in the database: no DAG file declares it"
    problem = True
    if facts is not None:
        cause, problem = _asset_cause(name, watcher_entries, producer_entries)
    return {
        "name": name,
        "uri": None if facts is None else facts.uri,
        "known": facts is not None,
        "satisfied": satisfied,
        "queued": queued_entry(queued),
        "last_event_at": None if facts is None else iso(facts.last_event_at),
        "last_event_source": None if facts is None else facts.last_event_source,
        "watchers": watcher_entries,
        "producers": producer_entries,
        "cause": cause,
        "cause_is_problem": problem,
    }


def _asset_cause(
    name: str, watchers: list[Watcher], producers: list[Producer]
) -> tuple[str | None, bool]:
    """What updates the asset, and whether that has a problem."""
    if watchers:
        ok = [w for w in watchers if w["status"] == "ok"]
        if not ok:
            w = watchers[0]
            more = f" (and {len(watchers) - 1} other watcher(s) have problems)" * (
                len(watchers) > 1
            )
            return f"its watcher {w['name']} {w['problem']}{more}", True
        w = ok[0]
        last = w["last_event_at"] or "never"
        return (
            f"its watcher {w['name']} runs on triggerer {w['triggerer_id']}; last event: {last}",
            False,
        )
    if producers:
        return _producer_cause(producers)
    return (
        "nothing updates it: no watcher, no task outlet; "
        f"`sluice assets emit {name}` or the REST API can",
        True,
    )


def _producer_cause(producers: list[Producer]) -> tuple[str, bool]:
    for p in producers:
        task = f"{p['dag_id']}.{p['task_id']}"
        if p["dag_paused"]:
            return f"it is updated by task {task}, whose DAG is paused", True
        if p["last_state"] in _FAILED:
            return (
                f"it is updated by task {task}, {p['last_state']} in run {p['last_run_id']}",
                True,
            )
    p = producers[0]
    task = f"{p['dag_id']}.{p['task_id']}"
    if p["last_state"] is None:
        return f"it is updated by task {task}, which has not run yet", False
    return (
        f"it is updated by task {task} (last: {p['last_state']} in run {p['last_run_id']})",
        False,
    )


def alias_entry(
    name: str,
    queued: QueuedEvents | None,
    *,
    satisfied: bool,
    assets: list[str],
    producers: list[ProducerFacts],
) -> AliasEntry:
    entries = [producer_entry(p) for p in producers]
    if entries:
        cause, problem = _producer_cause(entries)
        cause = cause.replace("it is updated by", "events are attached to it by")
    else:
        cause, problem = "no task attaches events through it (outlets)", True
    return {
        "name": name,
        "satisfied": satisfied,
        "queued": queued_entry(queued),
        "assets": assets,
        "producers": entries,
        "cause": cause,
        "cause_is_problem": problem,
    }
