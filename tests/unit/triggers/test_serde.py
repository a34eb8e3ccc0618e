from __future__ import annotations

import hashlib
import json
import math
import threading
from datetime import UTC, date, datetime, time, timedelta, timezone
from pathlib import Path, PosixPath, PurePosixPath, PureWindowsPath
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from triggers.base import TriggerEvent
from triggers.exceptions import SerializationError
from triggers.serde import (
    MAX_DEPTH,
    TYPE_KEY,
    deserialize_value,
    dumps,
    dumps_kwargs,
    loads,
    loads_kwargs,
    payload_digest,
    serialize_value,
)

# --- strategies ---------------------------------------------------------------------------

MAX_OFFSET = timedelta(hours=23, minutes=59, seconds=59)
OFFSETS = st.builds(
    timezone,
    st.integers(-MAX_OFFSET.seconds, MAX_OFFSET.seconds).map(lambda s: timedelta(seconds=s)),
)
ZONES = st.sampled_from(
    ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
).map(ZoneInfo)
AWARE_DATETIMES = st.datetimes(
    min_value=datetime(1800, 1, 1),
    max_value=datetime(2300, 1, 1),
    timezones=st.one_of(OFFSETS, ZONES, st.just(UTC)),
    allow_imaginary=False,
)
PATH_PARTS = st.lists(
    st.text(alphabet="abcxyz019._- ", min_size=1, max_size=8).filter(lambda p: p != "."),
    max_size=4,
)
PATHS = st.one_of(
    PATH_PARTS.map(lambda parts: PurePosixPath("/", *parts)),
    PATH_PARTS.map(lambda parts: PosixPath(*parts)),
)
HASHABLE_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.just(TYPE_KEY),
    st.binary(max_size=10),
    st.dates(),
    AWARE_DATETIMES,
    st.times(timezones=st.none() | OFFSETS),
    st.timedeltas(),
    st.uuids(),
    st.decimals(allow_nan=False),
    PATHS,
)
HASHABLES = st.recursive(
    HASHABLE_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(inner, max_size=3),
    ),
    max_leaves=6,
)
SCALARS = st.one_of(HASHABLE_SCALARS, st.floats())  # nan and inf as well
VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.sets(HASHABLES, max_size=4),
        st.frozensets(HASHABLES, max_size=4),
        st.dictionaries(st.text(max_size=6) | st.just(TYPE_KEY), children, max_size=4),
        st.dictionaries(HASHABLES, children, max_size=4),
    ),
    max_leaves=20,
)


def assert_same(original: Any, restored: Any) -> None:
    """Equal values of the same types, down to float signs and datetime offsets."""
    if isinstance(original, PurePosixPath):
        assert type(restored) is type(Path())
        assert restored == Path(original)
        return
    assert type(restored) is type(original), (original, restored)
    if isinstance(original, float):
        assert repr(restored) == repr(original)
    elif isinstance(original, datetime | time):
        assert restored == original
        assert restored.utcoffset() == original.utcoffset()
        if isinstance(original.tzinfo, ZoneInfo):
            assert restored.tzinfo is original.tzinfo
    elif isinstance(original, list | tuple):
        assert len(restored) == len(original)
        for left, right in zip(original, restored, strict=True):
            assert_same(left, right)
    elif isinstance(original, dict):
        assert restored.keys() == original.keys()
        for key, value in original.items():
            assert_same(value, restored[key])
    else:
        assert restored == original


def filled_set(items: list[object]) -> set[object]:
    result: set[object] = set()
    for item in items:
        result.add(item)
    return result


def rebuilt(value: Any) -> Any:
    """An equal copy of ``value`` whose sets and dicts were filled in reverse order."""
    if isinstance(value, list):
        return [rebuilt(item) for item in value]
    if isinstance(value, tuple):
        return tuple(rebuilt(item) for item in value)
    if isinstance(value, set | frozenset):
        return type(value)(rebuilt(item) for item in reversed(list(value)))
    if isinstance(value, dict):
        return {rebuilt(k): rebuilt(v) for k, v in reversed(list(value.items()))}
    return value


# --- round trip and determinism -----------------------------------------------------------


@given(VALUES)
def test_round_trip_keeps_values_and_types(value: object) -> None:
    assert_same(value, loads(dumps(value)))
    assert_same(value, deserialize_value(serialize_value(value)))


@given(VALUES)
def test_equal_values_give_equal_strings(value: object) -> None:
    text = dumps(value)
    assert dumps(rebuilt(value)) == text
    assert dumps(loads(text)) == text


@given(st.dictionaries(st.text(max_size=8) | st.just(TYPE_KEY), VALUES, max_size=5))
def test_kwargs_round_trip(kwargs: dict[str, object]) -> None:
    text = dumps_kwargs(kwargs, owner="plugins.MyTrigger")
    assert_same(kwargs, loads_kwargs(text))
    assert dumps_kwargs(rebuilt(kwargs), owner="x") == text


def test_set_order_does_not_change_the_output() -> None:
    # hash(2**61) == hash(1): iteration order of these sets follows insertion order.
    first, second = filled_set([1, 2**61, "a"]), filled_set(["a", 2**61, 1])
    assert list(first) != list(second)
    assert dumps(first) == dumps(second)
    assert dumps({1: "x", 2**61: "y"}) == dumps({2**61: "y", 1: "x"})
    assert payload_digest(first) == payload_digest(second)


def test_wire_format_is_stable() -> None:
    assert dumps({"b": 1, "a": [True, None]}) == '{"a":[true,null],"b":1}'
    assert dumps((1, "x")) == '{"__sluice_type__":"tuple","v":[1,"x"]}'
    assert dumps(math.inf) == '{"__sluice_type__":"float","v":"inf"}'
    assert dumps(b"\x00\xff") == '{"__sluice_type__":"bytes","v":"AP8="}'
    assert dumps({1: 2}) == '{"__sluice_type__":"dict","v":[[1,2]]}'
    when = datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert dumps(when) == '{"__sluice_type__":"datetime","v":"2024-05-01T12:30:00+02:00"}'
    assert dumps(timedelta(days=1, microseconds=5)) == (
        '{"__sluice_type__":"timedelta","v":[1,0,5]}'
    )


def test_reserved_key_in_a_user_dict_round_trips() -> None:
    value = {TYPE_KEY: "tuple", "v": [1, 2]}
    assert loads(dumps(value)) == value
    assert type(loads(dumps(value))) is dict
    assert loads_kwargs(dumps_kwargs(value, owner="x")) == value


def test_nan_round_trips_through_a_tag() -> None:
    restored = loads(dumps([math.nan, -math.inf]))
    assert isinstance(restored, list)
    assert math.isnan(restored[0])
    assert restored[1] == -math.inf


def test_zoned_datetime_keeps_its_zone_across_a_dst_fold() -> None:
    paris = ZoneInfo("Europe/Paris")
    ambiguous = datetime(2024, 10, 27, 2, 30, tzinfo=paris, fold=1)
    restored = loads(dumps(ambiguous))
    assert isinstance(restored, datetime)
    assert restored.tzinfo is paris
    assert restored.utcoffset() == timedelta(hours=1)
    assert restored == ambiguous


def test_shared_references_are_not_cycles() -> None:
    shared = [1, 2]
    assert loads(dumps([shared, shared, {"k": shared}])) == [[1, 2], [1, 2], {"k": [1, 2]}]


def test_payload_digest_is_sha256_of_dumps() -> None:
    payload = {"key": (1, 2), "at": date(2024, 1, 1)}
    assert payload_digest(payload) == hashlib.sha256(dumps(payload).encode()).hexdigest()
    assert payload_digest({"key": [1, 2]}) != payload_digest({"key": (1, 2)})


# --- errors -------------------------------------------------------------------------------


def test_error_names_the_kwarg_path_and_owner() -> None:
    lock = threading.Lock()
    with pytest.raises(SerializationError) as info:
        dumps_kwargs({"ok": 1, "x": {"a": [1, 2, lock]}}, owner="plugins.FooTrigger")
    assert str(info.value) == (
        "cannot serialize kwarg 'x'['a'][2] of plugins.FooTrigger: "
        f"object of type {type(lock).__name__} is not serializable"
    )


def test_error_uses_the_where_prefix() -> None:
    with pytest.raises(SerializationError, match=r"^cannot serialize result\[0\]\[1\]: "):
        serialize_value([(1, object())], where="result")
    with pytest.raises(SerializationError, match=r"cannot serialize TriggerEvent payload\['k'\]"):
        TriggerEvent({"k": object()})


def test_error_inside_non_str_key_dict_and_set() -> None:
    with pytest.raises(SerializationError, match=r"value\[1\]: object of type object"):
        dumps({1: object()})
    with pytest.raises(SerializationError, match=r"value\[<key>\]: object of type Unhashable"):
        dumps({Unhashable(): 1})
    with pytest.raises(SerializationError, match=r"value\[0\]\{<set member>\}"):
        dumps([{Unhashable()}])


class Unhashable:
    def __hash__(self) -> int:
        return 1


@pytest.mark.parametrize(
    "value",
    [
        datetime(2024, 1, 1, 12, 0),
        [{"when": datetime(2024, 1, 1)}],
    ],
)
def test_naive_datetime_is_refused(value: object) -> None:
    with pytest.raises(SerializationError, match="naive datetime not allowed, use an aware one"):
        dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        datetime(2024, 1, 1, tzinfo=timezone(timedelta(microseconds=1))),
        time(1, 2, tzinfo=timezone(timedelta(seconds=-1, microseconds=5))),
    ],
)
def test_sub_second_utc_offsets_are_refused(value: object) -> None:
    with pytest.raises(SerializationError, match="sub-second precision"):
        dumps(value)


def test_time_with_a_zone_but_no_offset_is_refused() -> None:
    with pytest.raises(SerializationError, match="no fixed offset"):
        dumps(time(1, 2, tzinfo=ZoneInfo("Europe/Paris")))


def test_naive_datetime_error_names_kwarg() -> None:
    with pytest.raises(SerializationError, match=r"^cannot serialize kwarg 'when' of T: naive"):
        dumps_kwargs({"when": datetime(2024, 1, 1)}, owner="T")


@pytest.mark.parametrize(
    "value",
    [PureWindowsPath("C:/x"), bytearray(b"x"), threading.Event(), lambda: 1],
)
def test_unsupported_types_are_refused(value: object) -> None:
    with pytest.raises(SerializationError, match="is not serializable"):
        dumps(value)


def test_cycles_are_refused() -> None:
    looped: list[object] = [1]
    looped.append(looped)
    with pytest.raises(
        SerializationError, match=r"value\[1\]: the value contains a reference cycle"
    ):
        dumps(looped)
    mapping: dict[str, object] = {}
    mapping["self"] = [mapping]
    with pytest.raises(SerializationError, match="cycle"):
        dumps_kwargs({"m": mapping}, owner="T")


def test_deep_nesting_is_refused_without_recursion_error() -> None:
    deep: list[object] = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(SerializationError, match="nested deeper than"):
        dumps(deep)
    nested_json = "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)
    with pytest.raises(SerializationError, match="nested deeper than"):
        loads(nested_json)
    with pytest.raises(SerializationError):
        loads("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "NaN",
        '{"__sluice_type__": "pickle", "v": "x"}',
        '{"__sluice_type__": "tuple", "v": [], "extra": 1}',
        '{"__sluice_type__": "datetime", "v": "yesterday"}',
        '{"__sluice_type__": "timedelta", "v": [1, 2]}',
        '{"__sluice_type__": "bytes", "v": "***"}',
        '{"__sluice_type__": "dict", "v": [[1]]}',
        '[{"__sluice_type__": "float", "v": "1.5"}]',
    ],
)
def test_malformed_stored_text_raises_serialization_error(text: str) -> None:
    with pytest.raises(SerializationError, match="cannot deserialize"):
        loads(text)


def test_loads_kwargs_wants_an_object_with_string_keys() -> None:
    with pytest.raises(SerializationError, match="expected an object with string keys"):
        loads_kwargs("[1]")
    with pytest.raises(SerializationError, match="expected an object with string keys"):
        loads_kwargs(dumps({1: 2}))


def test_kwarg_names_must_be_strings() -> None:
    with pytest.raises(SerializationError, match="kwarg names must be str"):
        dumps_kwargs({1: 2}, owner="T")  # type: ignore[dict-item]


# --- the plain-JSON fast path of TriggerEvent ----------------------------------------------

PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.just(TYPE_KEY), children, max_size=4)
    ),
    max_leaves=20,
)


@given(PLAIN | VALUES)
def test_the_fast_check_accepts_only_what_is_its_own_json_form(value: Any) -> None:
    from triggers.serde import _is_plain_json

    if _is_plain_json(value):
        assert serialize_value(value) == value  # nothing to encode: the check may skip it
        assert json.loads(json.dumps(value)) == value


@given(PLAIN | VALUES)
def test_an_event_payload_is_accepted_exactly_when_it_serializes(value: Any) -> None:
    try:
        serialize_value(value, where="TriggerEvent payload")
    except SerializationError as expected:
        with pytest.raises(SerializationError) as raised:
            TriggerEvent(value)
        assert str(raised.value) == str(expected)
    else:
        assert TriggerEvent(value).payload is value


def test_a_cycle_or_a_subclass_takes_the_encoder_path() -> None:
    from triggers.serde import _is_plain_json

    loop: list[Any] = []
    loop.append(loop)
    assert not _is_plain_json(loop)
    with pytest.raises(SerializationError, match="cycle"):
        TriggerEvent({"a": loop})

    class Tagged(dict):  # type: ignore[type-arg]
        pass

    assert not _is_plain_json(Tagged(a=1))
    assert not _is_plain_json({"a": float("nan")})
    assert not _is_plain_json({TYPE_KEY: "x"})
