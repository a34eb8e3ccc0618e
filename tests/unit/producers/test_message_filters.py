"""The body_filter and apply_function pieces every broker trigger shares (pure, no broker)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from producers.exceptions import EventFilterError, ProducerConfigError
from producers.message_filters import (
    MISSING,
    accepts,
    apply,
    body_matches,
    function_path_problem,
    json_body_matches,
    load_apply_function,
    lookup,
)


def is_even(message: Any, offset: int = 0) -> bool:
    return (message + offset) % 2 == 0


async def is_even_later(message: Any, offset: int = 0) -> bool:
    await anyio.lowlevel.checkpoint()
    return is_even(message, offset)


NOT_CALLABLE = 3


@pytest.mark.parametrize(
    ("expected", "actual", "accepted"),
    [
        ("order", "order", True),
        ("order", "refund", False),
        (["refund", "chargeback"], "chargeback", True),
        (["refund", "chargeback"], "order", False),
        (1, True, False),  # JSON equality: true is not 1
        (True, 1, False),
        (True, True, True),
        ([1, 2], 2.0, True),
        ("order", MISSING, False),
        (None, MISSING, False),
    ],
)
def test_accepts_is_json_equality_with_one_value_or_one_of_a_list(
    expected: Any, actual: Any, accepted: bool
) -> None:
    assert accepts(expected, actual) is accepted


def test_lookup_follows_a_dotted_path_of_objects_only() -> None:
    body = {"order": {"status": "paid", "lines": [1, 2]}, "kind": None}
    assert lookup(body, "order.status") == "paid"
    assert lookup(body, "kind") is None
    assert lookup(body, "order.lines.0") is MISSING  # lists are not walked
    assert lookup(body, "order.missing") is MISSING
    assert lookup("text", "order") is MISSING


def test_body_matches_needs_every_rule() -> None:
    body = {"kind": "order", "order": {"region": "eu"}}
    assert body_matches({"kind": "order", "order.region": ["eu", "uk"]}, body)
    assert not body_matches({"kind": "order", "order.region": "us"}, body)
    assert not body_matches({"absent": None}, body)
    assert body_matches({}, body)


def test_a_body_filter_on_a_body_that_is_no_json_object_raises_naming_the_message() -> None:
    assert json_body_matches({"kind": "order"}, {"kind": "order"}, "message 7")
    with pytest.raises(EventFilterError, match=r"message 7 has a body that is not a JSON"):
        json_body_matches({"kind": "order"}, "plain text", "message 7")


def test_an_apply_function_path_is_checked_where_the_trigger_is_declared() -> None:
    assert function_path_problem(None) is None
    assert function_path_problem("package.module.function") is None
    problem = function_path_problem("function")
    assert problem is not None and "'function'" in problem


def test_an_apply_function_is_imported_where_the_trigger_runs_or_refused() -> None:
    here = __name__
    assert load_apply_function(f"{here}.is_even", trigger_id=3) is is_even
    with pytest.raises(ProducerConfigError, match=r"trigger 3: cannot import apply_function"):
        load_apply_function(f"{here}.no_such_function", trigger_id=3)
    with pytest.raises(ProducerConfigError, match=r"trigger 3: cannot import apply_function"):
        load_apply_function("no_such_package.module.f", trigger_id=3)
    with pytest.raises(ProducerConfigError, match="is not callable"):
        load_apply_function(f"{here}.NOT_CALLABLE", trigger_id=3)


async def test_apply_calls_with_the_arguments_and_awaits_an_async_function() -> None:
    with anyio.fail_after(5):
        assert await apply(is_even, 4, [], {}) is True
        assert await apply(is_even, 4, [1], {}) is False
        assert await apply(is_even_later, 3, [], {"offset": 1}) is True
