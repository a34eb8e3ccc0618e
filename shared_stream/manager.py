"""``SharedStreamManager``: groups sibling event triggers by key and shares one poll per key.

How the runtime uses it (one task per trigger, everything on the event loop thread)::

    stream = manager.subscribe(trigger_id=tid, trigger=trigger, key=key)
    try:
        async for event in trigger.filter_shared_stream(stream):
            seq = manager.bind_pending_event(trigger_id=tid, key=key)  # None in fast mode
            outbox.put(event, confirm=seq)
    finally:
        await manager.unsubscribe(tid, key)

    # the persister, after each commit, on the event loop thread:
    manager.confirm_persisted([seq for seq in committed if seq is not None])

The manager owns one task group (``run()`` or ``async with``); each group runs in it as a
task named ``shared-stream-poll[<key repr>]``. It owns which group takes the subscribers
of each key (a stopping group takes none: the next subscribe of its key starts a fresh
one) and the routing of binding seqs to their groups (``routes.BindingRoutes``); each
group owns its subscribers and its ledger, and hears from the manager only through calls.

As Airflow's, a manager stays usable after ``stop_all()``: it stops the groups, not the
manager, and the next ``subscribe`` of a key starts a fresh group. ``aclose()`` (or leaving
``async with``) also ends the service; once ``run()`` has exited, ``subscribe`` raises
``ManagerNotRunning`` until ``run()`` (or ``async with``) starts again.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any, Final, Self

import anyio
import anyio.lowlevel

from shared_stream.exceptions import (
    InvalidSubscription,
    ManagerNotRunning,
    SharedStreamTerminated,
)
from shared_stream.group import SharedStreamGroup
from shared_stream.restarts import GroupEnd, group_end, start_note
from shared_stream.routes import SERIAL_SHIFT, BindingRoutes
from shared_stream.settings import GroupSettings
from shared_stream.stats import merge, merge_by_key, retired
from triggers.base import BaseEventTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Hashable, Iterable
    from types import TracebackType

    from anyio.abc import TaskGroup, TaskStatus

    from shared_stream.stats import GroupStats

logger = logging.getLogger(__name__)

DEFAULT_STOP_GRACE_PERIOD_S: Final = 30.0
DEFAULT_COHORT_RETURN_S: Final = 5.0


class SharedStreamManager:
    """Runs one shared poll per ``shared_stream_key`` and fans it out to the subscribers.

    ``max_subscriber_queue``: raw events a subscriber may have unread before it is failed
    with ``SubscriberOverflow``. ``ack_timeout``: seconds (from broadcast) within which an
    ack-mode subscriber must resolve an event before it is failed with ``AckTimeout``.
    ``cohort_grace_period``: seconds a new group waits before its first poll, so siblings
    that (re)subscribe together all see the first event. ``cohort_return``: ack mode, how
    long a group waits (fanning nothing out) for a subscriber that failed to be back (the
    events it failed come back from the broker, it must see them too). ``clock``: monotonic
    seconds, for ack timeouts only. ``stop_grace_period``: bound on draining advances at stop.
    ``may_advance``: asked right before every ``producer.advance`` (the owner's lease, see
    ``fence``); an advance it refuses ends its group, and the broker redelivers.
    """

    def __init__(
        self,
        *,
        max_subscriber_queue: int = 1024,
        ack_timeout: float = 300.0,
        cohort_grace_period: float = 0.0,
        cohort_return: float = DEFAULT_COHORT_RETURN_S,
        clock: Callable[[], float] = time.monotonic,
        stop_grace_period: float = DEFAULT_STOP_GRACE_PERIOD_S,
        may_advance: Callable[[], bool] | None = None,
    ) -> None:
        _check_positive("max_subscriber_queue", max_subscriber_queue)
        _check_positive("ack_timeout", ack_timeout)
        _check_positive("stop_grace_period", stop_grace_period)
        _check_positive("cohort_return", cohort_return)
        if not cohort_grace_period >= 0:
            raise ValueError(f"cohort_grace_period must be >= 0, got {cohort_grace_period!r}")
        self._clock = clock
        # the newest group of each key, until its task ends; it takes subscribers until it
        # stops (see ``_taking``)
        self._groups: dict[Hashable, SharedStreamGroup] = {}
        # every group whose task has not ended, oldest first (an ordered set)
        self._live: dict[SharedStreamGroup, None] = {}
        # key repr -> counters of its finished groups, kept while a group of the key lives
        self._retired: dict[str, GroupStats] = {}
        self._routes: BindingRoutes[SharedStreamGroup] = BindingRoutes()
        self._by_serial = self._routes.by_serial  # read by confirm_persisted, once per seq
        # how the last group of each key ended, when no group of the key took its place
        # yet: what the next group's start line says (``shared_stream.restarts``)
        self._ended: dict[Hashable, GroupEnd] = {}
        # keys whose last group was terminated with subscribers: who they were, so that the
        # next group waits for them before its first poll (``SharedStreamGroup.cohort``)
        self._cohorts: dict[Hashable, frozenset[int]] = {}
        self._settings = GroupSettings(
            max_queue=max_subscriber_queue,
            ack_timeout_s=ack_timeout,
            cohort_grace_s=cohort_grace_period,
            cohort_return_s=cohort_return,
            stop_grace_s=stop_grace_period,
            clock=clock,
            may_advance=self._may_advance,
        )
        self._owner_may_advance = may_advance
        self._fenced: str | None = None
        self._tg: TaskGroup | None = None
        self._stop_requested: anyio.Event | None = None
        # why subscribes are refused while the task group is still up (stop_all, aclose)
        self._refusing: str | None = None
        self._shutting_down = False

    # -- service --------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``aclose()`` or cancellation; signals readiness through
        ``task_status.started()``. ``stop_all()`` stops the groups but not the service."""
        self._check_startable()
        self._stop_requested = stop_requested = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await stop_requested.wait()
        finally:
            self._tg = None
            self._stop_requested = None
            self._refusing = None

    async def aclose(self) -> None:
        """Stop every group (``stop_all()``), then end ``run()``; it may be started again."""
        if self._tg is None:
            return
        self._refusing = "it is closing"
        try:
            await self.stop_all()
        finally:
            if self._stop_requested is not None:
                self._stop_requested.set()

    async def __aenter__(self) -> Self:
        self._check_startable()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        self._refusing = "it is closing"
        try:
            await self.stop_all()
        finally:
            self._tg = None
            self._refusing = None
            result = await tg.__aexit__(exc_type, exc, tb)
        return result

    async def stop_all(self) -> None:
        """Stop every group; waits for the drains. The manager stays usable (as Airflow's):
        the next ``subscribe`` of a key starts a fresh group; ``run()`` keeps serving.

        Each group drains its resolved advances within the stop grace period, then closes
        its producer. Remaining subscribers' streams raise ``SharedStreamTerminated``.
        Subscribes are refused (``ManagerNotRunning``) until the drains are over.
        """
        refusing, self._refusing = self._refusing, "stop_all() is in progress"
        shutting_down, self._shutting_down = self._shutting_down, True
        try:
            for group in self._taking_groups():
                group.begin_stop("stopped: the shared stream manager is shutting down")
            for group in list(self._live):
                await group.finished.wait()
        finally:
            self._refusing = refusing
            self._shutting_down = shutting_down  # begin_shutdown() (the triggerer's) stands

    # -- subscribers ----------------------------------------------------------------------

    def subscribe(
        self, *, trigger_id: int, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]:
        """Join the group of ``key`` (starting it if needed); returns the raw event stream."""
        tg = self._tg
        if tg is None:
            raise ManagerNotRunning(
                "the SharedStreamManager is not running: use `async with SharedStreamManager()` "
                "or start `run()` in a task group before subscribing (a manager whose run() "
                "ended can run again)"
            )
        if self._refusing is not None:
            raise ManagerNotRunning(
                f"the SharedStreamManager is not running new subscriptions: {self._refusing}; "
                f"subscribe trigger {trigger_id!r} after it returns"
            )
        _check_key(trigger_id, key)
        if not isinstance(trigger, BaseEventTrigger):
            raise InvalidSubscription(
                f"trigger {trigger_id!r} ({type(trigger).__qualname__}) is not a "
                "BaseEventTrigger; only event triggers can share a stream"
            )
        try:
            group = self._taking(key)
        except TypeError as exc:
            raise InvalidSubscription(
                f"shared_stream_key() of trigger {trigger_id!r} returned an unhashable "
                f"{type(key).__name__}; return a tuple of strings"
            ) from exc
        if group is None:
            group = self._start_group(tg, key, trigger)
        return group.add_subscriber(trigger_id)

    def bind_pending_event(self, *, trigger_id: int, key: Hashable) -> int | None:
        """Bind the trigger event the subscriber's filter just yielded to its current raw event.

        Ack mode: returns the binding seq to pass to ``confirm_persisted`` once that trigger
        event is committed. None (nothing to confirm): fast mode, or no raw event is being
        processed (before the first one, after a reject, subscriber already failed).
        """
        group = self._groups.get(key)
        if group is None:
            return None
        # The seq carries the group's serial (``routes``). A stopping group binds nothing:
        # its ledger dropped every subscriber as it stopped (``AckLedger.stop``).
        return group.bind(trigger_id)

    def confirm_persisted(self, seqs: Iterable[int]) -> None:
        """The trigger events bound under these seqs are committed; unknown seqs are ignored."""
        # Each seq goes straight to its group's ledger (one shift and one lookup, see
        # ``routes``); each ledger that got a lane ready dispatches once, after all of them,
        # so one batch takes what they made ready. A confirmation voids no other seq (only
        # refusals and failures do), so nothing needs re-checking between seqs.
        groups = self._by_serial
        readied: dict[SharedStreamGroup, None] | None = None
        for seq in seqs:
            group = groups.get(seq >> SERIAL_SHIFT)  # serials start at 1
            if group is None:
                if seq >> SERIAL_SHIFT:
                    continue  # its group ended
                group = self._routes.take_explicit(seq)
                if group is None:
                    continue
            if group.confirm_binding(seq):
                if readied is None:
                    readied = {}
                readied[group] = None
        if readied is not None:
            for group in readied:
                effects = group.dispatch()
                if effects:
                    group.carry_out(effects)

    def refuse_persisted(self, seqs: Iterable[int]) -> None:
        """The store refused the trigger events bound under these seqs (their payload is over
        the limit): their raw events resolve as rejected (dead-lettered by the producer).
        Several seqs bound to one raw event reject it once (and count as one reject)."""
        for group, run in self._routes.take(seqs):
            group.refuse(run)

    def _may_advance(self) -> bool:
        if self._fenced is not None:
            return False
        return self._owner_may_advance is None or self._owner_may_advance()

    @property
    def fenced(self) -> str | None:
        """Why the manager was fenced, or None."""
        return self._fenced

    def fence(self, reason: str) -> None:
        """The owner lost its lease: every group's producer leaves its broker's consumer
        membership now (synchronously: nothing else of the loop runs first), nothing is ever
        advanced again, and every group ends; the broker redelivers to the new owner what
        was not advanced. New subscriptions are refused."""
        if self._fenced is not None:
            return
        self._fenced = reason
        self._refusing = f"its owner lost its lease ({reason})"
        for group in list(self._live):
            group.fence(reason)

    def begin_shutdown(self) -> None:
        """From now on a leaving subscriber stops its whole group instead of failing events.

        A graceful shutdown is not a subscriber failure: events the subscribers have not
        resolved must be redelivered, not advanced as failed (dead-lettered, skipped). Call
        this before stopping the subscribers' triggers; each group then advances its
        resolved prefixes and abandons the rest.
        """
        self._shutting_down = True

    async def unsubscribe(self, trigger_id: int, key: Hashable, *, failed: bool = False) -> None:
        """Leave the group; the last subscriber stops it and waits for the drain.

        ``failed``: the subscriber's filter raised: the event it was processing (and any
        awaiting confirmation) fails instead of counting as moved past (see ``AckLedger``).

        The state changes happen before the first await: if the caller is cancelled while
        waiting, the group still drains (in its own task, bounded by the stop grace period).
        """
        group = self._taking(key)
        if group is None:
            return
        if self._shutting_down:
            group.begin_stop("stopped: shutting down")
        # absent if it already failed (overflow, timeout)
        group.remove_subscriber(trigger_id, failed=failed)
        if not group.streams:
            group.begin_stop("stopped: its last subscriber left")
            await group.finished.wait()  # bounded: the group enforces its stop grace period

    async def check_timeouts(self) -> None:
        """Fail ack-mode subscribers past the ack timeout now (groups also do it on a timer)."""
        now = self._clock()
        for group in self._taking_groups():
            group.check_timeouts(now)
        await anyio.lowlevel.checkpoint()

    @property
    def pending_confirmations(self) -> int:
        """Binding seqs handed out by ``bind_pending_event`` and not confirmed nor dropped."""
        live = sum(group.pending_confirmations for group in self._live)
        return len(self._routes) + live

    @property
    def group_keys(self) -> tuple[Hashable, ...]:
        """Keys of the groups taking subscribers."""
        return tuple(group.key for group in self._taking_groups())

    def stats(self) -> list[GroupStats]:
        """One snapshot per key with a live group, ordered by key.

        A group still draining and the group that replaced it are one snapshot (see
        ``shared_stream.stats``), with the counters of the key's groups that finished
        meanwhile, so no counter goes down while the key has a live group.
        Synchronous and cheap: call it on the event loop thread (it reads group state).
        """
        live = (group.stats() for group in self._live)  # oldest first: the newest wins
        return merge_by_key(itertools.chain(self._retired.values(), live))

    def subscriber_count(self, key: Hashable) -> int:
        """How many subscribers the group of ``key`` has (0 when there is no such group)."""
        group = self._taking(key)
        return 0 if group is None else len(group.streams)

    # -- internals ------------------------------------------------------------------------

    def _start_group(
        self, tg: TaskGroup, key: Hashable, trigger: BaseEventTrigger
    ) -> SharedStreamGroup:
        _classpath, kwargs = trigger.serialize()
        group = SharedStreamGroup(
            key=key,
            trigger_cls=type(trigger),
            kwargs=kwargs,
            settings=self._settings,
            routes=self._routes,
        )
        previous = self._groups.get(key)
        self._groups.pop(key, None)  # a stopping group of the key: the new one comes last
        self._groups[key] = group
        self._live[group] = None
        now, ended = self._clock(), self._ended.pop(key, None)
        cohort = self._cohorts.pop(key, frozenset())
        if previous is not None:  # still draining: how it ends, and its subscribers
            ended = group_end(previous, now)
            cohort = previous.returning or cohort
        group.cohort = cohort
        level, note = start_note(ended, now)
        logger.log(
            level,
            "Shared stream group started key=%r%s",
            key,
            note,
            extra={"action": "shared_stream.group_started", "mode": group.mode},
        )
        tg.start_soon(self._run_group, group, name=f"shared-stream-poll[{key!r}]")
        return group

    async def _run_group(self, group: SharedStreamGroup) -> None:
        try:
            await group.run()
        except asyncio.CancelledError as exc:
            if _cancelled_for_real():
                raise
            self._stray_cancel(group, exc)
        finally:
            del self._live[group]
            self._routes.close(group.serial)
            self._retire(group)
            self._forget_group(group)
            if group.key not in self._groups:  # no group of the key took its place yet
                self._ended[group.key] = group_end(group, self._clock())
            if group.returning and group.key not in self._groups:
                self._cohorts[group.key] = group.returning

    def _stray_cancel(self, group: SharedStreamGroup, exc: BaseException) -> None:
        """A ``CancelledError`` nobody asked for left the group (a broker client awaited a
        task it had cancelled itself, e.g. aiokafka's ``stop()``). Let through, it would
        cancel the manager's task group and end ``run()`` in silence: every later subscribe
        refused (``ManagerNotRunning``) while the triggerer runs on. The group fails instead."""
        logger.error(
            "Shared stream group key=%r: its producer raised a CancelledError while nothing "
            "cancelled it (%r); the group ends as failed",
            group.key,
            exc,
            extra={"action": "shared_stream.stray_cancel"},
        )
        if not group.terminated:
            group.terminate(
                SharedStreamTerminated(
                    f"the producer of shared stream key={group.key!r} raised CancelledError "
                    "while nothing cancelled it"
                )
            )

    def _retire(self, group: SharedStreamGroup) -> None:
        """Keep a finished group's counters while another group of its key lives."""
        final = group.stats()
        if not any(other.label == group.label for other in self._live):
            self._retired.pop(final.key, None)
            return
        seen = self._retired.get(final.key)
        self._retired[final.key] = retired(final if seen is None else merge(seen, final))

    def _forget_group(self, group: SharedStreamGroup) -> None:
        if self._groups.get(group.key) is group:
            del self._groups[group.key]

    def _taking(self, key: Hashable) -> SharedStreamGroup | None:
        """The group of ``key`` taking subscribers: None when it stopped (or there is none)."""
        group = self._groups.get(key)
        return None if group is None or group.stopping else group

    def _taking_groups(self) -> list[SharedStreamGroup]:
        """Every group taking subscribers, in the order their keys got them."""
        return [group for group in self._groups.values() if not group.stopping]

    def _check_startable(self) -> None:
        if self._tg is not None:
            raise RuntimeError(
                "this SharedStreamManager is already running (run() or `async with`); "
                "start it once at a time"
            )

    def __repr__(self) -> str:
        return (
            f"<SharedStreamManager groups={len(self._taking_groups())} live={len(self._live)} "
            f"retired={len(self._retired)} "
            f"unconfirmed={self.pending_confirmations} running={self._tg is not None} "
            f"refusing={self._refusing!r}>"
        )


def _check_positive(name: str, value: float) -> None:
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{name} must be positive, got {value!r}")


def _check_key(trigger_id: int, key: object) -> None:
    if key is None:
        raise InvalidSubscription(
            f"trigger {trigger_id!r} has no shared_stream_key(): run its own run() instead"
        )
    if inspect.iscoroutine(key):
        key.close()
        raise InvalidSubscription(
            f"shared_stream_key() of trigger {trigger_id!r} is an async def: it returned a "
            "coroutine, not a key; make it a plain def returning a tuple of strings"
        )


def _cancelled_for_real() -> bool:
    """The current task has a cancellation pending (a cancel scope's, or ``Task.cancel``)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
