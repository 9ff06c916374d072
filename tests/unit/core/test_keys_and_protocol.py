"""Cache keys and the upstream tool_input / answer rules."""

from __future__ import annotations

import json

import pytest

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key, canonical_key, upstream_key
from stabletoolbench_mirror.core.protocol import ToolInputParseError, parse_tool_input


def test_upstream_key_is_python_repr_of_the_parsed_dict() -> None:
    parsed = json.loads('{\n  "q": "birthday party ideas",\n  "n": 3, "ok": true, "x": null}')
    assert upstream_key(parsed) == "{'q': 'birthday party ideas', 'n': 3, 'ok': True, 'x': None}"
    assert upstream_key({}) == "{}"


def test_upstream_key_is_order_and_type_sensitive() -> None:
    assert upstream_key({"a": 1, "b": 2}) != upstream_key({"b": 2, "a": 1})
    assert upstream_key({"a": 1}) != upstream_key({"a": "1"})


@pytest.mark.parametrize(
    "a, b, same",
    [
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
        ({"x": {"b": [1, {"d": 1, "c": 2}], "a": 0}}, {"x": {"a": 0, "b": [1, {"c": 2, "d": 1}]}}, True),
        ({"a": 1}, {"a": "1"}, False),
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": [1, 2]}, {"a": [2, 1]}, False),  # list order is data
        ({"a": None}, {}, False),
        ({"a": float("nan")}, {"a": "nan"}, False),  # upstream: {'a': nan} vs {'a': 'nan'}
        ({"a": float("nan")}, {"a": "NaN"}, False),
        ({"a": float("inf")}, {"a": "inf"}, False),
        ({"a": float("inf")}, {"a": "Infinity"}, False),
        ({"a": float("-inf")}, {"a": "-inf"}, False),
        ({"a": float("inf")}, {"a": float("-inf")}, False),
        ({"b": 1, "a": float("nan")}, {"a": float("nan"), "b": 1}, True),
        ({"a": json.loads("1e999")}, {"a": float("inf")}, True),  # upstream keys both {'a': inf}
    ],
)
def test_canonical_key(a, b, same: bool) -> None:
    assert (canonical_key(a) == canonical_key(b)) is same


def test_canonical_key_of_an_upstream_key_matches_the_value() -> None:
    value = {"b": [1, "x"], "a": {"z": None, "y": True}}
    assert canonical_from_upstream_key(str(value)) == canonical_key(value)
    assert canonical_from_upstream_key("__import__('os').system('true')") is None  # never evaluated
    assert canonical_from_upstream_key("{'a': ") is None


@pytest.mark.parametrize(
    "raw, expected",
    [
        ('{"a": 1}', {"a": 1}),
        ('{\n  "q": "x"\n}', {"q": "x"}),
        ("", {}),
        ({"already": "dict"}, {"already": "dict"}),
        ("[1, 2]", [1, 2]),  # upstream accepts any JSON value
    ],
)
def test_parse_tool_input(raw, expected) -> None:
    assert parse_tool_input(raw) == expected


@pytest.mark.parametrize("raw", ["{not json", "{'a': 1}", "   ", "{\"a\": 1", "[" * 100000])
def test_parse_tool_input_errors(raw: str) -> None:
    with pytest.raises(ToolInputParseError):
        parse_tool_input(raw)


def test_exact_upstream_strings() -> None:
    assert protocol.parse_error_answer() == {"error": "Tool input parse error...\n", "response": ""}
    assert protocol.chat_with_user_answer() == {"error": "", "response": "Chat with user."}
    assert protocol.simulation_failed_answer() == {"error": "Failed to generate fake response", "response": ""}
    # the miss error is the exact text the client maps to "API not working" (status 6)
    assert protocol.miss_answer("a/b/c", "replay mode")["error"] == "API not working error..."
    # compact like FastAPI's JSONResponse, error first, non-ASCII kept
    assert protocol.encode_answer(protocol.answer("", "é")) == '{"error":"","response":"é"}'
