"""The /virtual body as upstream's client sends it: what is accepted, what is refused (and why), and the answers'
encoding."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.protocol import MAX_NAME_CHARS, VirtualRequest

BODY = {"category": "Data", "tool_name": "Weather", "api_name": "Get Forecast", "tool_input": '{"city": "Paris"}',
        "strip": "", "toolbench_key": ""}


def test_upstreams_body_is_read_and_unknown_fields_are_ignored() -> None:
    request = VirtualRequest.model_validate({**BODY, "extra": 1})
    assert (request.category, request.tool_name, request.api_name, request.tool_input) == ("Data", "Weather", "Get Forecast", '{"city": "Paris"}')
    short = VirtualRequest.model_validate({k: BODY[k] for k in ("category", "tool_name", "api_name", "tool_input")})
    assert (short.strip, short.toolbench_key) == ("", "")
    assert VirtualRequest.model_validate({**BODY, "tool_input": {"city": "Paris"}}).tool_input == {"city": "Paris"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"category": "x" * (MAX_NAME_CHARS + 1)}, f"at most {MAX_NAME_CHARS} characters"),
        ({"tool_name": "bad\nname"}, "control character U+000A at position 3"),
        ({"api_name": "\x85next"}, "control character U+0085 at position 0"),
        ({"api_name": "del\x7f"}, "control character U+007F"),
        ({"category": 5}, "Input should be a valid string"),  # strict: no coercion
        ({"tool_input": ["a"]}, "tool_input"),
        ({"tool_input": 3}, "tool_input"),
        ({"strip": None}, "strip"),
        ({"api_name": "lone \ud800"}, "api_name contains a lone UTF-16 surrogate"),
        ({"tool_input": '{"q": "\ud83d"}'}, "tool_input contains a lone UTF-16 surrogate"),
        ({"tool_input": {"q": ["\udfff"]}}, "tool_input contains a lone UTF-16 surrogate"),
        ({"toolbench_key": "\ud800"}, "toolbench_key contains a lone UTF-16 surrogate"),
    ],
)
def test_a_body_that_cannot_be_a_call_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        VirtualRequest.model_validate({**BODY, **change})
    assert message in str(caught.value)


@pytest.mark.parametrize("name", ["x" * MAX_NAME_CHARS, "日本語の名前", "tab-free name with spaces", "emoji 😀"])
def test_names_up_to_the_limit_and_any_printable_text_are_accepted(name: str) -> None:
    assert VirtualRequest.model_validate({**BODY, "api_name": name}).api_name == name


@pytest.mark.parametrize(
    ("value", "encodable"),
    [("text", True), ("\ud800", False), ({"a": ["b", {"c": "\udfff"}]}, False), ({"a": 1}, True), ({1, 2}, True), (b"x", True)],
)
def test_is_encodable(value: Any, encodable: bool) -> None:
    assert protocol.is_encodable(value) is encodable


def test_answers_are_encoded_as_fastapi_encodes_them() -> None:
    assert protocol.encode_answer({"error": "", "response": "é \"q\""}) == '{"error":"","response":"é \\"q\\""}'
    assert protocol.encode_answer(protocol.simulation_failed_answer()) == '{"error":"Failed to generate fake response","response":""}'
    assert protocol.encode_answer(protocol.chat_with_user_answer()) == '{"error":"","response":"Chat with user."}'
    assert list(protocol.answer("e", "r")) == ["error", "response"]  # upstream's key order


def test_a_miss_answer_names_the_api_and_the_reason() -> None:
    assert protocol.miss_answer("Data/t_for_Data/a", "replay mode") == {
        "error": protocol.MISS_ERROR, "response": "stabletoolbench-mirror: no recorded response for Data/t_for_Data/a (replay mode)."}
    assert protocol.miss_answer("Data/t_for_Data/a", "simulator down")["response"].endswith("Data/t_for_Data/a (simulator down).")


@pytest.mark.parametrize(("text", "value"), [("", {}), ("[1, 2]", [1, 2]), ('"s"', "s"), ("null", None), ("1e400", float("inf"))])
def test_tool_input_is_any_json_value_as_upstream_takes_it(text: str, value: Any) -> None:
    assert protocol.parse_tool_input(text) == value
