"""``Param``: JSON-schema checks of DAG and task params, and how they combine."""

from __future__ import annotations

import logging
import re

import pytest

from engine import DagDefinitionError, Param
from engine.authoring import params as params_module
from engine.authoring.params import NOTSET, as_params, resolve_params
from engine.exceptions import ParamValidationError

CASES = [
    # (schema, good values, bad values, words in the error)
    ({"type": "string"}, ["", "x"], [1, None, True], "is not of type string"),
    ({"type": "integer"}, [0, -3, 2.0], [1.5, "1", True], "is not of type integer"),
    ({"type": "number"}, [1, 1.5], ["1", False, float("nan")], "is not of type number"),
    ({"type": "boolean"}, [True, False], [0, "true"], "is not of type boolean"),
    ({"type": "array"}, [[], [1], (1,)], [{}, "ab"], "is not of type array"),
    ({"type": "object"}, [{}, {"a": 1}], [[], "x"], "is not of type object"),
    ({"type": "null"}, [None], [0, ""], "is not of type null"),
    ({"type": ["null", "string"]}, [None, "x"], [1], "is not of type one of"),
    ({"enum": ["a", "b"]}, ["a"], ["c"], "is not one of ['a', 'b']"),
    ({"const": 3}, [3], [4], "is not 3"),
    ({"minimum": 1, "maximum": 5}, [1, 5], [0, 6], "the m"),
    ({"exclusiveMinimum": 1, "exclusiveMaximum": 5}, [2, 4], [1, 5], "not"),
    ({"minLength": 2, "maxLength": 3}, ["ab", "abc"], ["a", "abcd"], "characters"),
    ({"minItems": 1, "maxItems": 2}, [[1], [1, 2]], [[], [1, 2, 3]], "items"),
    ({"pattern": "^[a-z]+$"}, ["abc"], ["ABC", "a1"], "does not match the pattern"),
]


@pytest.mark.parametrize(("schema", "good", "bad", "words"), CASES)
def test_param_checks_json_schema_keywords(schema, good, bad, words) -> None:
    param = Param(**schema)
    for value in good:
        assert param.resolve(value, name="p") == value
    for value in bad:
        with pytest.raises(ParamValidationError, match=f"param 'p': .*{re.escape(words)}"):
            param.resolve(value, name="p")


def test_param_default_description_and_missing_value() -> None:
    param = Param(5, description="how many", type="integer")
    assert (param.value, param.description, param.schema["type"]) == (5, "how many", "integer")
    assert param.resolve() == 5 and param.resolve(7) == 7 and param.has_value
    assert param.dump() == {"value": 5, "description": "how many", "schema": param.schema}
    required = Param(type="string")
    assert not required.has_value and required.value is NOTSET
    with pytest.raises(ParamValidationError, match="no value passed"):
        required.resolve(name="who")
    assert Param(None, type=["null", "integer"]).resolve() is None


def test_bad_schemas_are_definition_errors(caplog, monkeypatch) -> None:
    monkeypatch.setattr(params_module, "_unchecked_warned", set())
    with pytest.raises(DagDefinitionError, match="type 'text' is not a JSON-schema type"):
        Param("x", type="text")
    with pytest.raises(DagDefinitionError, match="pattern is invalid"):
        Param("x", pattern="(")
    with caplog.at_level(logging.WARNING, logger="engine.authoring.params"):
        Param("2025-01-01", type="string", format="date", title="Day")  # checked
        Param("a", format="multiline")  # a trigger form's text area: nothing to check
        Param("x", format="hostname", contentMediaType="text/plain")
        Param("y", format="hostname", contentMediaType="text/plain")  # once per process
    unchecked = [r.keyword for r in caplog.records if getattr(r, "keyword", None)]
    assert unchecked == ["format=hostname", "contentMediaType"]  # "title" describes


def test_plain_values_become_params_and_defaults_are_checked() -> None:
    params = as_params({"n": 1, "p": Param("x", enum=["x", "y"])}, where="here")
    assert params["n"] == Param(1) and params["p"].value == "x"
    with pytest.raises(DagDefinitionError, match="here: the default of param 'p'"):
        as_params({"p": Param("z", enum=["x"])}, where="here")
    with pytest.raises(DagDefinitionError, match="params must be a dict"):
        as_params(["n"], where="here")


def test_dag_then_task_then_conf() -> None:
    dag_params = {"a": Param(1, type="integer"), "b": Param("dag")}
    task_params = {"b": Param("task")}
    assert resolve_params(dag_params, task_params, None) == {"a": 1, "b": "task"}
    assert resolve_params(dag_params, task_params, {"a": 2, "c": [1]}) == {
        "a": 2,
        "b": "task",
        "c": [1],
    }
    with pytest.raises(ParamValidationError, match="param 'a'"):
        resolve_params(dag_params, task_params, {"a": "two"})
