"""``cache export --format chat-jsonl``: training lines whose prompt is the live prompt, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.commands.cli import main
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.protocol import VirtualRequest
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.snapshots.tree_import import import_tree
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.openai_stub import OpenAIStub
from tests.integration.test_prompt_parity import upstream_messages, write_upstream_prompts


def read_lines(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for line in lines:
        assert list(line) == ["messages"]
        assert [m["role"] for m in line["messages"]] == ["system", "user", "assistant"]
        assert all(isinstance(m["content"], str) and set(m) == {"role", "content"} for m in line["messages"])
    return lines


@pytest.fixture
def setup(tmp_path, reference_dir) -> dict[str, Any]:
    layout = json.loads((reference_dir / "mirrorapi_prompts.json").read_text())
    prompts_file = write_upstream_prompts(tmp_path / "stb" / "server" / "system_prompts.py", layout)
    config = tmp_path / "config.yml"
    config.write_text(
        json.dumps(
            {
                "store": {"path": str(tmp_path / "store")},
                "tools_folder": str(reference_dir / "toolenv" / "tools"),
                "simulator": {"system_prompt_file": str(tmp_path / "stb")},
            }
        )
    )
    with DiskcacheStore(str(tmp_path / "store")) as store:
        import_tree(store, reference_dir / "cache", progress=False)
    return {"config": config, "layout": layout, "prompts_file": prompts_file, "tools": reference_dir / "toolenv" / "tools"}


@pytest.mark.parametrize("style", ["mirrorapi-sft", "mirrorapi-cache"])
def test_prompt_turns_equal_the_live_prompt(style, setup, tmp_path, reference_calls, settings_factory, serve) -> None:
    out = tmp_path / f"{style}.jsonl"
    assert main(["cache", "export", "--config", str(setup["config"]), "--format", "chat-jsonl", "--style", style, str(out), "--quiet"]) == 0
    lines = read_lines(out)
    # the live prompt of every reference call, as a real stub receives it from the server
    with OpenAIStub() as stub:
        settings = settings_factory(
            tools_folder=str(setup["tools"]),
            store={"path": str(tmp_path / "live-store")},
            simulator={"enabled": True, "style": style, "api_base": stub.api_base, "system_prompt_file": str(setup["prompts_file"])},
        )
        server = serve(settings)
        live = {}
        for item in reference_calls:
            call = ToolCall.from_request(VirtualRequest.model_validate(item["payload"]))
            server.post(item["payload"])
            live[(call.api, call.key)] = (stub.requests[-1]["messages"], item)
    assert len(lines) == len(live) == 16  # one line per distinct recorded call
    by_prompt = {json.dumps(line["messages"][:2], ensure_ascii=False): line for line in lines}
    for messages, item in live.values():
        line = by_prompt[json.dumps(messages, ensure_ascii=False)]  # byte-identical system and user turns
        assert messages == upstream_messages(setup["layout"], setup["tools"], item["payload"], style)
        assert json.loads(line["messages"][2]["content"]) == item["observed"]
        assert line["messages"][2]["content"] == json.dumps(item["observed"], ensure_ascii=False)


def test_cot_needs_a_rationale_and_filters_dedup(setup, tmp_path) -> None:
    ns = "Data/theclique_for_Data/songkick_concert"
    with DiskcacheStore(str(tmp_path / "store")) as store:
        # a simulated record that kept its rationale, and one that did not
        store.add(
            Record.from_answer(ns, str({"id_conc": "1"}), {"error": "", "response": "{\"a\": 1}"}, "simulated", "MirrorAPI",
                               {"mechanism_of_the_api": "It looks the concert up.", "style": "mirrorapi-cot"}),
            '{"id_conc":"1"}',
        )  # fmt: skip
        store.add(Record.from_answer(ns, str({"id_conc": "2"}), {"error": "", "response": "b"}, "simulated", "MirrorAPI"), '{"id_conc":"2"}')
        # the same input in another key order: a duplicate of an imported call
        store.add(
            Record.from_answer("Data/theclique_for_Data/transfermarkt_details",
                               str({"part_slug": "paris-saint-germain", "id_talent": "583", "other": "", "type_s": "clubs"}),
                               {"error": "", "response": "later"}, "real"),
            None,
        )  # fmt: skip
        store.add(Record.from_answer("Other/t_for_Other/a", str({"x": 1}), {"error": "", "response": "other"}, "real"), '{"x":1}')
        # a failure record (what a miss without a usable answer was served) is nothing to train on
        store.add(
            Record.failure("Other/t_for_Other/a", str({"x": 2}), {"error": "Failed to generate fake response", "response": ""},
                           "simulated", "MirrorAPI", reason="output not parsable"),
            '{"x":2}',
        )  # fmt: skip
    out = tmp_path / "cot.jsonl"
    base = ["cache", "export", "--config", str(setup["config"]), "--format", "chat-jsonl", "--quiet"]
    assert main([*base, "--style", "mirrorapi-cot", str(out)]) == 0
    (line,) = read_lines(out)
    assert line["messages"][0]["content"] == setup["layout"]["cot_system"]
    assert list(json.loads(line["messages"][2]["content"])) == ["mechanism_of_the_api", "error", "response"]
    assert json.loads(line["messages"][2]["content"])["mechanism_of_the_api"] == "It looks the concert up."
    # sft: every distinct call once (the reordered duplicate is not a second line); filters
    assert main([*base, "--style", "mirrorapi-sft", str(out)]) == 0
    assert len(read_lines(out)) == 16 + 2 + 1
    assert main([*base, "--style", "mirrorapi-sft", "--source", "real", str(out)]) == 0
    # (filtered first: the real record of the reordered input is the only one of its call among the real ones)
    assert [json.loads(m["messages"][2]["content"])["response"] for m in read_lines(out)] == ["later", "other"]
    assert main([*base, "--style", "mirrorapi-sft", "--category", "Other", "--category", "Nope", str(out)]) == 0
    assert len(read_lines(out)) == 1
    # bad use changes nothing
    before = out.read_bytes()
    assert main([*base, str(out)]) == 2
    assert main([*base, "--style", "mirrorapi-sft", str(tmp_path)]) == 2
    assert out.read_bytes() == before
