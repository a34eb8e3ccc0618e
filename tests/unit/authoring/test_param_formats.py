"""``Param(format=...)``: the JSON-schema formats Airflow's validator checks (date,
date-time, time, email, ipv4/6, uuid, regex), at definition, at trigger time
(``check_run_conf`` over stored specs) and in the task's params."""

from __future__ import annotations

import pytest

from engine import Param
from engine.authoring.errors import DagDefinitionError
from engine.authoring.params import as_params, check_run_conf, param_spec, resolve_params
from engine.exceptions import ParamValidationError


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date", ["2026-03-10", "2024-02-29"], ["2026-02-30", "2026-3-10", "10/03/2026", ""]),
        (
            "date-time",
            ["2026-03-10T09:00:00Z", "2026-03-10t09:00:00.25+02:00", "2026-03-10T23:59:60-05:30"],
            ["2026-03-10T09:00:00", "2026-03-10 09:00:00Z", "2026-03-10T25:00:00Z", "2026-03-10"],
        ),
        ("time", ["12:13:14", "12:13:14.5Z", "00:00:00+01:00"], ["12:13", "24:00:00", "noon"]),
        ("email", ["ann@example.com", "a@b"], ["ann.example.com"]),
        ("ipv4", ["192.0.2.1"], ["192.0.2.256", "::1"]),
        ("ipv6", ["2001:db8::1"], ["192.0.2.1", "2001:db8::g"]),
        ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
        ("regex", ["^[a-z]+$"], ["("]),
    ],
)
def test_formats_accept_and_refuse_as_airflow(fmt: str, good: list[str], bad: list[str]) -> None:
    param = Param(type="string", format=fmt)
    for value in good:
        assert param.resolve(value, name="p") == value
    for value in bad:
        with pytest.raises(ParamValidationError, match=rf"param 'p': '.*' is not a '{fmt}'"):
            param.resolve(value, name="p")


def test_a_format_applies_to_strings_only() -> None:
    param = Param(None, type=["null", "string"], format="date")
    assert param.resolve(name="p") is None
    assert param.resolve("2026-03-10", name="p") == "2026-03-10"


def test_a_bad_default_is_a_definition_error() -> None:
    with pytest.raises(DagDefinitionError, match="'tomorrow' is not a 'date'"):
        as_params({"day": Param("tomorrow", type="string", format="date")}, where="here")


def test_the_task_refuses_a_bad_conf_value() -> None:
    params = as_params({"day": Param("2026-03-10", type="string", format="date")}, where="x")
    assert resolve_params(params, {}, {"day": "2026-03-11"}) == {"day": "2026-03-11"}
    with pytest.raises(ParamValidationError, match="param 'day'"):
        resolve_params(params, {}, {"day": "2026-13-01"})


def test_trigger_time_check_reads_stored_specs() -> None:
    params = {
        "day": Param("2026-03-10", type="string", format="date"),
        "to": Param(type="string", format="email"),
        "n": Param(3, type="integer"),
    }
    specs = {name: param_spec(param) for name, param in params.items()}
    check_run_conf(specs, {"to": "ann@example.com"})
    check_run_conf(specs, {"to": "ann@example.com", "day": "2026-01-31", "extra": [1]})
    with pytest.raises(ParamValidationError, match="param 'to': no value passed"):
        check_run_conf(specs, {})
    with pytest.raises(ParamValidationError, match="param 'to': 'ann' is not a 'email'"):
        check_run_conf(specs, {"to": "ann"})
    with pytest.raises(ParamValidationError, match="param 'n': '3' is not of type integer"):
        check_run_conf(specs, {"to": "a@b", "n": "3"})


def test_specs_of_another_shape_are_not_checked() -> None:
    check_run_conf({"day": "2026-03-10"}, {"day": "not a date"})  # stored before specs were
    check_run_conf(None, {"anything": 1})
