"""The simulator output parser: examples and hypothesis properties over MirrorAPI-like outputs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stabletoolbench_mirror.responders.simulator.parsing import decode_string, parse_output

# what MirrorAPI puts in "response": free text with quotes and braces, or a JSON document
TEXT_CHARS = st.characters(
    codec="utf-8",
    exclude_categories=("Cs", "Cc"),
    exclude_characters="\\",
) | st.sampled_from(list('"{}[]:,\n '))
JSON_SAFE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters='\\"'), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | JSON_SAFE,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(JSON_SAFE, children, max_size=4),
    max_leaves=12,
)
RESPONSES = st.one_of(
    st.text(TEXT_CHARS, min_size=1, max_size=200),
    JSON_VALUES.map(lambda v: json.dumps(v, ensure_ascii=False)),
    JSON_VALUES.map(lambda v: json.dumps(v, ensure_ascii=False, indent=2)),
).filter(lambda s: s.strip() != "")
ERRORS = st.one_of(st.just(""), st.text(st.characters(codec="ascii", categories=("L", "N", "Zs")), max_size=30))
MECHANISMS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters='\\:'), max_size=120)
TRAILING = st.text(st.characters(codec="ascii", categories=("L", "N", "Zs"), include_characters=".!\n"), min_size=1, max_size=60)


def render(fields: dict[str, str], *, escaped: bool, pretty: bool) -> str:
    """The object as a model might write it: proper JSON, or values pasted in without escaping."""
    if escaped:
        return json.dumps(fields, ensure_ascii=bool(len(fields) % 2), indent=4 if pretty else None)
    sep, indent = (",\n", "    ") if pretty else (", ", "")
    inner = sep.join(f'{indent}"{k}": "{v}"' for k, v in fields.items())
    return "{\n" + inner + "\n}" if pretty else "{" + inner + "}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    response=RESPONSES,
    error=ERRORS,
    mechanism=st.none() | MECHANISMS,
    escaped=st.booleans(),
    pretty=st.booleans(),
    fence=st.booleans(),
    ending=st.sampled_from(["plain", "trailing", "missing_brace"]),
    trailing=TRAILING,
)
def test_mirrorapi_like_outputs_parse_back(
    response: str, error: str, mechanism: str | None, escaped: bool, pretty: bool, fence: bool, ending: str, trailing: str
) -> None:
    fields: dict[str, str] = {}
    if mechanism is not None:
        fields["mechanism_of_the_api"] = mechanism
    fields["error"] = error
    fields["response"] = response
    text = render(fields, escaped=escaped, pretty=pretty)
    if not escaped:
        # pasted-in values can make an object that is valid JSON with another meaning: ambiguous
        try:
            # (the parser accepts raw control characters in strings, as vLLM's output may hold them)
            assume(json.JSONDecoder(strict=False).raw_decode(text)[0] == fields)
        except ValueError:
            pass
    if ending == "missing_brace":
        text = text.rstrip()[:-1].rstrip()
    if fence:
        text = "```json\n" + text + "\n```"
    if ending == "trailing":
        text = text + "\n\n" + trailing
    parsed = parse_output(text)
    assert parsed.answer == {"error": error, "response": response}, text
    assert list(parsed.answer) == ["error", "response"]
    if mechanism is not None and (escaped or ending != "missing_brace"):
        assert parsed.mechanism == mechanism


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_or_fails_cleanly(text: str) -> None:
    parsed = parse_output(text)
    if parsed.answer is None:
        assert parsed.method == "failed"
    else:
        assert set(parsed.answer) == {"error", "response"}
        assert isinstance(parsed.answer["error"], str)
        assert parsed.answer["error"] or parsed.answer["response"] not in ("", [], {})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["error", "response", "mechanism_of_the_api", "x"]), JSON_VALUES, max_size=4))
def test_strict_json_objects_keep_their_values(value: dict[str, Any]) -> None:
    parsed = parse_output(json.dumps(value))
    error = value.get("error")
    response = value.get("response")
    if "error" not in value and "response" not in value:
        assert parsed.answer is None
        return
    expected_error = "" if error is None else error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)
    expected_response = "" if response is None else response
    if not expected_error and expected_response in ("", [], {}):
        assert parsed.answer is None
    else:
        assert parsed.answer == {"error": expected_error, "response": expected_response}
        assert parsed.method == "json"


@pytest.mark.parametrize(
    "text, response",
    [
        # MirrorAPI's own training example: quotes inside "response" left unescaped
        ('{\n    "error": "",\n    "response": "{"status":0,"msg":"Success","languages":["en","fr-fr","pt-br"]}"\n}', '{"status":0,"msg":"Success","languages":["en","fr-fr","pt-br"]}'),
        ('Response:\n    {\n        "error": "",\n        "response": "ok"\n    }', "ok"),
        ("{'error': '', 'response': 'a Python dict'}", "a Python dict"),
        ('```\n{"error": "", "response": "no language tag"}\n```', "no language tag"),
        ('{"error": "", "response": "tab\there, \\u00e9 and a bad escape \\q"}', "tab\there, é and a bad escape \\q"),
        ('{"response": "response first", "error": ""}', "response first"),
        ('{"error": "", "response": {"object": "value"}}', {"object": "value"}),
    ],
)
def test_known_shapes(text: str, response: Any) -> None:
    parsed = parse_output(text)
    assert parsed.answer == {"error": "", "response": response}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "I cannot help with that.",
        '{"error": "", "response": ""}',
        '{"status": 0, "data": [1, 2]}',
        '{"error": "", "response": "truncated in the middle of a str',
        "[1, 2, 3]",
        '{"error": "", "response": [1, 2',
    ],
)
def test_unusable_outputs_fail(text: str) -> None:
    assert parse_output(text).answer is None


def test_decode_string_repairs() -> None:
    assert decode_string('a "quoted" word') == 'a "quoted" word'
    assert decode_string("line\\nbreak") == "line\nbreak"
    assert decode_string("bad \\x escape") == "bad \\x escape"
    assert decode_string("half \\u12 escape") == "half \\u12 escape"
