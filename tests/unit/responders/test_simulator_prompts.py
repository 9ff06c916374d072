"""Prompt rendering against MirrorAPI's documented layout (``../shared/reference/mirrorapi_prompts.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.naming import change_name, standardize
from stabletoolbench_mirror.core.protocol import VirtualRequest
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.responders.simulator import prompts
from stabletoolbench_mirror.upstream.tooldocs import ApiDoc, ToolDocs


@pytest.fixture(scope="module")
def layout(reference_dir: Path) -> dict[str, Any]:
    return json.loads((reference_dir / "mirrorapi_prompts.json").read_text())


def expected_user_turn(layout: dict[str, Any], tools: Path, request: dict[str, Any]) -> str:
    """The user turn built straight from the reference layout and the raw tool file."""
    category = request["category"]
    docs = [json.loads(p.read_text()) for p in (tools / category).glob("*.json")]
    (tool,) = [d for d in docs if standardize(d["tool_name"]) == standardize(request["tool_name"])]
    (api,) = [a for a in tool["api_list"] if change_name(standardize(a["name"])) == change_name(standardize(request["api_name"]))]
    values = {
        "api_name": api["name"],
        "api_description": api["description"],
        "required_parameters": api["required_parameters"],
        "optional_parameters": api["optional_parameters"],
        "tool_description": tool["tool_description"],
        "tool_name": request["tool_name"],
        "tool_category": category,
    }
    api_doc = {key: values[key] for key in layout["api_doc_keys_in_order"]}
    tool_input = json.loads(request["tool_input"]) if request["tool_input"] else {}
    tool_input.pop("toolbench_key", None)
    return layout["user_template"].format(api_doc=str(api_doc), request=str(tool_input))


def test_layout_constants_match_the_reference(layout: dict[str, Any]) -> None:
    assert prompts.MIRRORAPI_USER_TEMPLATE == layout["user_template"]
    call = ToolCall.of("Data", "Some Tool", "Some API", {})
    for doc in (None, ApiDoc(category="Data", tool_name="Some Tool", tool_description="t", name="Some API", description="d")):
        assert list(prompts.api_doc_dict(call, doc)) == layout["api_doc_keys_in_order"]


def test_user_turn_matches_reference_layout_byte_for_byte(layout, reference_dir: Path, reference_calls) -> None:
    tools = reference_dir / "toolenv" / "tools"
    docs = ToolDocs(tools)
    checked = 0
    for item in reference_calls:
        request = dict(item["payload"])
        # a toolbench_key inside the input must not reach the prompt
        tool_input = json.loads(request["tool_input"]) if request["tool_input"] else {}
        tool_input["toolbench_key"] = "secret"
        request["tool_input"] = json.dumps(tool_input)
        call = ToolCall.from_request(VirtualRequest.model_validate(request))
        doc = docs.find(call.names)
        assert doc is not None
        for style_system in (prompts.SFT_SYSTEM_PROMPT, prompts.COT_SYSTEM_PROMPT):
            messages = prompts.mirrorapi_messages(style_system, call, doc)
            assert [m["role"] for m in messages] == ["system", "user"]
            assert messages[1]["content"] == expected_user_turn(layout, tools, request)
            assert "secret" not in messages[1]["content"]
        checked += 1
    assert checked == len(reference_calls) > 0


def test_sample_doc_rendering_is_exact() -> None:
    call = ToolCall.of("Artificial_Intelligence_Machine_Learning", "TTSKraken", "List Languages", {"lang": "en", "n": 3})
    from stabletoolbench_mirror.upstream.tooldocs import ApiDoc

    doc = ApiDoc(
        category="Artificial_Intelligence_Machine_Learning",
        tool_name="TTSKraken",
        tool_description="Text to speech.",
        name="List Languages",
        description="Get a list of currently supported languages.",
        required_parameters=[],
        optional_parameters=[{"name": "n", "type": "NUMBER", "description": "", "default": 1}],
    )
    assert prompts.mirrorapi_user_turn(call, doc) == (
        "API doc:\n"
        "{'api_name': 'List Languages', 'api_description': 'Get a list of currently supported languages.', "
        "'required_parameters': [], 'optional_parameters': [{'name': 'n', 'type': 'NUMBER', 'description': '', "
        "'default': 1}], 'tool_description': 'Text to speech.', 'tool_name': 'TTSKraken', "
        "'tool_category': 'Artificial_Intelligence_Machine_Learning'}\n\n"
        "Request:\n{'lang': 'en', 'n': 3}"
    )


def test_tool_name_suffix_and_missing_doc() -> None:
    call = ToolCall.of("Data", "keyword_analysis_for_Data", "popularsitesforquery", {})
    turn = prompts.mirrorapi_user_turn(call, None)
    assert "'tool_name': 'keyword_analysis'" in turn and "'tool_category': 'Data'" in turn
    assert turn.endswith("Request:\n{}")


def test_default_prompts_ask_for_the_schema() -> None:
    for key in ('"error"', '"response"'):
        assert key in prompts.SFT_SYSTEM_PROMPT and key in prompts.COT_SYSTEM_PROMPT and key in prompts.GPT_SYSTEM_PROMPT
    cot = prompts.COT_SYSTEM_PROMPT
    assert cot.index('"mechanism_of_the_api"') < cot.index('"error"') < cot.index('"response"')
    assert "mechanism_of_the_api" not in prompts.SFT_SYSTEM_PROMPT


def test_examples_are_chosen_by_similarity_within_budget() -> None:
    ns = "Data/t_for_Data/a"
    call = ToolCall.of("Data", "t", "a", {"city": "Paris", "days": 3})
    recs = [
        Record.from_answer(ns, str({"city": c, "days": d}), {"error": "", "response": f"{c}-{d}"}, "real")
        for c, d in [("Tokyo", 7), ("Paris", 2), ("Parma", 3), ("Lima", 1), ("Paris", 3)]
    ]
    chosen = prompts.choose_examples(call, recs, max_examples=2, budget_chars=10_000)
    # the identical input itself is never its own example
    assert [k for k, _ in chosen] == [str({"city": "Paris", "days": 2}), str({"city": "Parma", "days": 3})]
    assert prompts.choose_examples(call, recs, 5, 0) == []
    assert prompts.choose_examples(call, recs, 0, 10_000) == []
    small = prompts.choose_examples(call, recs, 5, 130)
    assert sum(prompts.example_chars(k, a) for k, a in small) <= 130 and len(small) == 2


def test_response_schema() -> None:
    assert prompts.response_schema(False) == {
        "type": "object",
        "properties": {"error": {"type": "string"}, "response": {"type": "string"}},
        "required": ["error", "response"],
        "additionalProperties": False,
    }
    assert list(prompts.response_schema(True, 64)["properties"]) == ["mechanism_of_the_api", "error", "response"]
