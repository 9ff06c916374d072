"""API-Bank inputs typed as its ToolManager types them, plus JSON values and lists written as text."""

from __future__ import annotations

import pytest

from stabletoolbench_mirror.apibank.inputs import InputError, read_literal, type_inputs

PARAMS = {
    "n": {"type": "int"},
    "x": {"type": "float"},
    "s": {"type": "str"},
    "on": {"type": "bool"},
    "items": {"type": "list"},
    "names": {"type": "list(str)"},
}


def test_text_is_typed_as_tool_manager_types_it() -> None:
    assert type_inputs({"n": "12", "x": "1.5", "s": "12", "on": "True"}, PARAMS) == {"n": 12, "x": 1.5, "s": "12", "on": True}
    assert type_inputs({"on": "False"}, PARAMS) == {"on": False}


def test_json_numbers_booleans_and_lists_are_taken_as_they_are() -> None:
    # ToolManager makes a JSON true False (true == 'True' is false); here it stays true
    assert type_inputs({"n": 3, "x": 2, "on": True, "items": [{"a": 1}]}, PARAMS) == {"n": 3, "x": 2.0, "on": True, "items": [{"a": 1}]}
    assert type_inputs({"on": "true"}, PARAMS) == {"on": True}


def test_lists_written_as_text_are_read_json_or_python_style() -> None:
    # how API-Bank's level-1 dialogues record them (RecordHealthData, AddMeeting's attendees)
    assert type_inputs({"names": "['John', 'Jane']"}, PARAMS) == {"names": ["John", "Jane"]}
    assert type_inputs({"items": "[{'name': 'heart_rate', 'value': '80'}]"}, PARAMS) == {"items": [{"name": "heart_rate", "value": "80"}]}
    assert type_inputs({"items": '["a", null, true, -1]'}, PARAMS) == {"items": ["a", None, True, -1]}
    assert type_inputs({"items": "not a list"}, PARAMS) == {"items": "not a list"}


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"nope": "1"}, "invalid parameter name. parameter: nope"),
        ({"n": "1x"}, "invalid parameter type. parameter: 1x"),
        ({"n": 1.5}, "invalid parameter type. parameter: 1.5"),
        ({"x": "a.b"}, "invalid parameter type."),
    ],
)
def test_what_tool_manager_refuses_is_refused_with_its_message(inputs: dict, message: str) -> None:
    with pytest.raises(InputError) as caught:
        type_inputs(inputs, PARAMS)
    assert str(caught.value) == message


@pytest.mark.parametrize("text", ["[__import__('os').system('true')]", "[open('/etc/passwd')]", "[x for x in ()]", "[1+1]", "[{**{}}]"])
def test_a_list_text_is_never_evaluated(text: str) -> None:
    with pytest.raises(ValueError):
        read_literal(text)
    # passed on as the text it is
    assert type_inputs({"items": text}, PARAMS) == {"items": text}
