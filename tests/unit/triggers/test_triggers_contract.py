"""The trigger contract: serialize/rebuild pairs, events, task-end events, shared-stream hooks."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from triggers import (
    BaseEventTrigger,
    BaseTrigger,
    DateTimeTrigger,
    DirectoryFileDeleteTrigger,
    DirectoryWatchTrigger,
    FileDeleteTrigger,
    FileTrigger,
    SerializationError,
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TimeDeltaTrigger,
    TriggerEvent,
    classpath_of,
)
from triggers.serde import dumps, loads
from triggers.testing import ManualTrigger

MOMENT = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def builtin_triggers() -> list[BaseTrigger]:
    return [
        DateTimeTrigger(MOMENT),
        DateTimeTrigger(MOMENT, end_from_trigger=True),
        TimeDeltaTrigger(timedelta(minutes=5)),
        TimeDeltaTrigger(timedelta(seconds=1), end_from_trigger=True),
        FileTrigger("/data/in/*.csv"),
        FileTrigger("/data/**/*.csv", recursive=True, poke_interval=0.5),
        FileDeleteTrigger("/data/flag", poke_interval=1.5),
        DirectoryFileDeleteTrigger("/data/inbox", "a.flag", poke_interval=2.0),
        DirectoryWatchTrigger("/data/drop", "*.parquet", recursive=False, debounce_ms=200),
        ManualTrigger(name="manual-1"),
    ]


def rebuild(classpath: str, kwargs: dict[str, Any]) -> BaseTrigger:
    module_name, _, class_name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    trigger = cls(**kwargs)
    assert isinstance(trigger, BaseTrigger)
    return trigger


@pytest.mark.parametrize("trigger", builtin_triggers(), ids=repr)
def test_builtin_rebuilds_equal_from_serialize(trigger: BaseTrigger) -> None:
    classpath, kwargs = trigger.serialize()
    rebuilt = rebuild(classpath, kwargs)
    assert rebuilt == trigger
    assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.parametrize("trigger", builtin_triggers(), ids=repr)
def test_builtin_serialize_survives_storage(trigger: BaseTrigger) -> None:
    classpath, kwargs = trigger.serialize()
    stored = loads(dumps(kwargs))
    assert stored == kwargs
    assert isinstance(stored, dict)
    assert rebuild(classpath, stored) == trigger


def test_time_delta_trigger_is_stored_as_its_moment() -> None:
    before = datetime.now(UTC)
    trigger = TimeDeltaTrigger(timedelta(hours=2))
    classpath, kwargs = trigger.serialize()
    assert classpath == "triggers.temporal.DateTimeTrigger"
    assert before + timedelta(hours=2) <= kwargs["moment"] <= datetime.now(UTC) + timedelta(hours=2)
    assert DateTimeTrigger(**kwargs) == trigger


def test_date_time_trigger_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="naive"):
        DateTimeTrigger(datetime(2030, 1, 1))


def test_date_time_trigger_stores_the_instant_in_utc() -> None:
    paris = datetime(2030, 6, 1, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))
    trigger = DateTimeTrigger(paris)
    assert trigger.moment == paris
    assert trigger.moment.utcoffset() == timedelta(0)


@given(
    moment=st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=5, minutes=30)), ZoneInfo("America/New_York")]
        ),
    ),
    end_from_trigger=st.booleans(),
)
def test_date_time_trigger_round_trips_any_aware_moment(
    moment: datetime, end_from_trigger: bool
) -> None:
    trigger = DateTimeTrigger(moment, end_from_trigger=end_from_trigger)
    classpath, kwargs = trigger.serialize()
    assert rebuild(classpath, loads(dumps(kwargs))) == trigger  # type: ignore[arg-type]


@given(filepath=st.text(min_size=1, max_size=40), interval=st.floats(0.001, 1e6))
def test_file_triggers_round_trip_any_path(filepath: str, interval: float) -> None:
    for trigger in (
        FileTrigger(filepath, poke_interval=interval),
        FileDeleteTrigger(filepath, poke_interval=interval),
    ):
        classpath, kwargs = trigger.serialize()
        assert rebuild(classpath, loads(dumps(kwargs))) == trigger  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: FileTrigger("/x", poke_interval=0),
        lambda: FileDeleteTrigger("/x", poke_interval=-1.0),
        lambda: DirectoryFileDeleteTrigger("/d", "sub/a.flag"),
        lambda: DirectoryFileDeleteTrigger("/d", ""),
        lambda: DirectoryWatchTrigger("/d", debounce_ms=0),
    ],
)
def test_invalid_arguments_are_refused_at_construction(make: Any) -> None:
    with pytest.raises(ValueError, match="must"):
        make()


def test_trigger_event_equality_is_by_payload() -> None:
    assert TriggerEvent({"a": 1}) == TriggerEvent({"a": 1})
    assert hash(TriggerEvent({"a": 1})) == hash(TriggerEvent({"a": 1}))
    assert TriggerEvent({"a": 1}) != TriggerEvent({"a": 2})
    assert TriggerEvent({"a": 1}, dedup_key="k") == TriggerEvent({"a": 1})
    assert TriggerEvent({"state": "success", "xcoms": {}}) != TaskSuccessEvent()


@pytest.mark.parametrize("payload", [object(), {"when": datetime(2030, 1, 1)}, {1j}])
def test_unserializable_payload_is_refused_at_construction(payload: object) -> None:
    with pytest.raises(SerializationError, match="TriggerEvent payload"):
        TriggerEvent(payload)


@pytest.mark.parametrize(
    ("event_cls", "state"),
    [(TaskSuccessEvent, "success"), (TaskFailedEvent, "failed"), (TaskSkippedEvent, "skipped")],
)
def test_task_end_events_carry_state_and_xcoms(event_cls: type[Any], state: str) -> None:
    event = event_cls(xcoms={"rows": 3})
    assert event.task_instance_state == state
    assert event.xcoms == {"rows": 3}
    assert event.payload == {"state": state, "xcoms": {"rows": 3}}
    assert event_cls().payload == {"state": state, "xcoms": {}}


def test_task_end_event_xcoms_are_named_by_str_keys() -> None:
    # The keys name the task's results in the DB; a non-str key would fail only later, in
    # the persister, leaving the task deferred.
    with pytest.raises(TypeError, match="xcoms keys must be str"):
        TaskSuccessEvent(xcoms={1: "x"})


class _FastModeTrigger(BaseEventTrigger):
    def __init__(self, key: str = "k") -> None:
        super().__init__()
        self.key = key

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (classpath_of(self), {"key": self.key})

    async def run(self) -> Any:
        yield TriggerEvent(self.key)


class _AckModeTrigger(_FastModeTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        return object()


class _AckModeChild(_AckModeTrigger):
    pass


def test_ack_mode_is_selected_by_overriding_the_producer_factory() -> None:
    assert not BaseEventTrigger.uses_ack_mode()
    assert not _FastModeTrigger.uses_ack_mode()
    assert not DirectoryFileDeleteTrigger.uses_ack_mode()
    assert _AckModeTrigger.uses_ack_mode()
    assert _AckModeChild.uses_ack_mode()


async def test_default_shared_stream_hooks_explain_what_to_implement() -> None:
    trigger = _FastModeTrigger()
    assert trigger.shared_stream_key() is None
    stream = _FastModeTrigger.open_shared_stream({"key": "k"})
    with anyio.fail_after(5), pytest.raises(NotImplementedError, match=r"_FastModeTrigger.*open_"):
        await anext(stream)
    with pytest.raises(NotImplementedError, match="create_shared_stream_producer"):
        _FastModeTrigger.create_shared_stream_producer({"key": "k"})
    with pytest.raises(NotImplementedError, match="filter_shared_stream"):
        trigger.filter_shared_stream(stream)


def test_directory_siblings_share_a_key_only_with_the_same_directory_and_cadence() -> None:
    a = DirectoryFileDeleteTrigger("/inbox", "a.flag", poke_interval=1.0)
    b = DirectoryFileDeleteTrigger("/inbox", "b.flag", poke_interval=1.0)
    c = DirectoryFileDeleteTrigger("/inbox", "c.flag", poke_interval=2.0)
    assert a.shared_stream_key() == b.shared_stream_key() == ("directory-scan", "/inbox", 1.0)
    assert a.shared_stream_key() != c.shared_stream_key()
    assert FileDeleteTrigger("/inbox/a.flag").shared_stream_key() is None
    assert DirectoryWatchTrigger("/inbox").shared_stream_key() is None


@pytest.mark.parametrize("trigger", builtin_triggers(), ids=lambda t: type(t).__name__)
def test_repr_names_kwargs_but_hides_their_values(trigger: BaseTrigger) -> None:
    text = repr(trigger)
    _, kwargs = trigger.serialize()
    for name, value in kwargs.items():
        assert name in text
        if isinstance(value, str):
            assert value not in text


def test_time_triggers_are_slotted_for_memory() -> None:
    trigger = TimeDeltaTrigger(timedelta(seconds=1))
    assert "moment" not in getattr(trigger, "__dict__", {})
    assert "end_from_trigger" not in getattr(trigger, "__dict__", {})
