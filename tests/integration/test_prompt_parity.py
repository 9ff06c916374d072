"""Prompt parity with the trained MirrorAPI models.

For every reference call and each MirrorAPI style, the messages the server sends to the model
(seen by a real OpenAI-compatible stub) equal, byte for byte, what an independent
re-implementation of StableToolBench's builder produces from ``mirrorapi_prompts.json``, with
the system prompt read from a ``system_prompts.py`` this test writes in upstream's format.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.responders.simulator import build_simulator, prompt_warning, system_prompt_for
from stabletoolbench_mirror.responders.simulator.prompts import SFT_SYSTEM_PROMPT
from tests.conftest import make_settings
from tests.helpers.openai_stub import OpenAIStub

STYLES = ("mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache")


# -- an independent re-implementation of upstream's builder ------------------------------------


def up_standardize(name: str) -> str:
    name = re.sub("[^\\u4e00-\\u9fa5^a-zA-Z0-9_]", "_", name)
    name = re.sub(r"(_)\1+", "_", name).lower().strip("_")
    return "get_" + name if name and name[0].isdigit() else name


def up_change_name(name: str) -> str:
    return "is_" + name if name in ("from", "class", "return", "false", "true", "id", "and") else name


def up_category(category: str) -> str:
    return category.replace(" ", "_").replace(",", "_").replace("/", "_").replace("__", "_")


def upstream_messages(layout: dict[str, Any], tools: Path, payload: dict[str, Any], style: str) -> list[dict[str, str]]:
    category = up_category(payload["category"])
    tool_name = payload["tool_name"]
    api_name = up_standardize(up_change_name(up_standardize(payload["api_name"])).split(f"_for_{tool_name}")[0])
    tool_file = tools / category / (up_standardize(tool_name).split("_for_")[0] + ".json")
    tool = json.loads(tool_file.read_text())
    (api,) = [a for a in tool["api_list"] if up_standardize(a["name"]) == api_name]
    values = {
        # main_mirrorapi.py names the API as the doc does; main_mirrorapi_cache.py by its standardized name
        "api_name": api_name if style == "mirrorapi-cache" else api["name"],
        "api_description": api["description"],
        "required_parameters": api["required_parameters"],
        "optional_parameters": api["optional_parameters"],
        "tool_description": tool["tool_description"],
        "tool_name": tool_name.split("_for_")[0],
        "tool_category": category,
    }
    api_doc = {key: values[key] for key in layout["api_doc_keys_in_order"]}
    request = json.loads(payload["tool_input"]) if payload["tool_input"] else {}
    request.pop("toolbench_key", None)
    system = layout["cot_system"] if style == "mirrorapi-cot" else layout["sft_system"]
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": layout["user_template"].format(api_doc=api_doc, request=request)},
    ]


def write_upstream_prompts(path: Path, layout: dict[str, Any]) -> Path:
    """A ``system_prompts.py`` laid out as StableToolBench's (triple-quoted constants, a line continuation)."""
    for text in (layout["sft_system"], layout["cot_system"]):
        assert '"""' not in text and "\\" not in text  # the layout below would not round-trip otherwise
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        'COT_SYSTEM="""\\\n' + layout["cot_system"] + '"""\n\n\nSFT_SYSTEM = """\\\n' + layout["sft_system"] + '"""',
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def layout(reference_dir: Path) -> dict[str, Any]:
    return json.loads((reference_dir / "mirrorapi_prompts.json").read_text())


@pytest.mark.parametrize("style", STYLES)
def test_messages_sent_equal_upstream_builder(style, layout, reference_dir, reference_calls, tmp_path, serve) -> None:
    tools = reference_dir / "toolenv" / "tools"
    prompts_file = write_upstream_prompts(tmp_path / "StableToolBench" / "server" / "system_prompts.py", layout)
    with OpenAIStub() as stub:
        settings = make_settings(
            tmp_path,
            tools_folder=str(tools),
            simulator={"enabled": True, "style": style, "api_base": stub.api_base, "system_prompt_file": str(prompts_file)},
        )
        server = serve(settings)
        for item in reference_calls:
            payload = dict(item["payload"])
            # a toolbench_key in the input never reaches the prompt
            tool_input = json.loads(payload["tool_input"]) if payload["tool_input"] else {}
            tool_input["toolbench_key"] = "tb-secret"
            payload["tool_input"] = json.dumps(tool_input)
            before = stub.count
            assert server.post(payload).status_code == 200
            assert stub.count == before + 1
            sent = stub.requests[-1]["messages"]
            assert sent == upstream_messages(layout, tools, payload, style)
            assert json.dumps(sent, ensure_ascii=False) == json.dumps(upstream_messages(layout, tools, payload, style), ensure_ascii=False)
        assert stub.count == len(reference_calls) == 16
        health = requests.get(server.url + "/health", timeout=10).json()
    constant = "COT_SYSTEM" if style == "mirrorapi-cot" else "SFT_SYSTEM"
    import hashlib

    expected_text = layout["cot_system"] if style == "mirrorapi-cot" else layout["sft_system"]
    assert health["simulator_prompt"] == {
        "style": style,
        "source": f"{prompts_file}:{constant}",
        "sha256": hashlib.sha256(expected_text.encode()).hexdigest(),
    }


def test_checkout_folder_and_plain_text_file(layout, tmp_path) -> None:
    checkout = tmp_path / "StableToolBench"
    write_upstream_prompts(checkout / "server" / "system_prompts.py", layout)
    for style, text in (("mirrorapi-sft", layout["sft_system"]), ("mirrorapi-cache", layout["sft_system"]), ("mirrorapi-cot", layout["cot_system"])):
        settings = make_settings(tmp_path, simulator={"style": style, "system_prompt_file": str(checkout)})
        prompt = system_prompt_for(settings)
        assert prompt.text == text and prompt.source.endswith("server/system_prompts.py:" + ("COT_SYSTEM" if style == "mirrorapi-cot" else "SFT_SYSTEM"))
    plain = tmp_path / "my_prompt.txt"
    plain.write_bytes(b"  verbatim\r\nprompt  \n")
    prompt = system_prompt_for(make_settings(tmp_path, simulator={"system_prompt_file": str(plain)}))
    assert prompt.text == "  verbatim\r\nprompt  \n" and prompt.source == str(plain)
    with pytest.raises(ConfigError, match="simulator.system_prompt_file: .*without StableToolBench's system_prompts.py"):
        system_prompt_for(make_settings(tmp_path, simulator={"system_prompt_file": str(tmp_path / "my_prompt.txt" / "..")}))


def test_prompts_file_is_never_run(tmp_path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "system_prompts.py"
    evil.write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        'SFT_SYSTEM = "safe text"\n'
        f"COT_SYSTEM = pathlib.Path({str(marker)!r}).read_text()\n"
    )
    settings = make_settings(tmp_path, simulator={"style": "mirrorapi-sft", "system_prompt_file": str(evil)})
    assert system_prompt_for(settings).text == "safe text"
    with pytest.raises(ConfigError, match="COT_SYSTEM is not assigned a plain string literal"):
        system_prompt_for(settings, "mirrorapi-cot")
    assert not marker.exists()
    (tmp_path / "broken.py").write_text("SFT_SYSTEM = '''unterminated\n")
    with pytest.raises(ConfigError, match="not Python source"):
        system_prompt_for(make_settings(tmp_path, simulator={"system_prompt_file": str(tmp_path / "broken.py")}))
    (tmp_path / "other.py").write_text("X = 'a'\n")
    with pytest.raises(ConfigError, match="no top-level string constant SFT_SYSTEM"):
        system_prompt_for(make_settings(tmp_path, simulator={"system_prompt_file": str(tmp_path / "other.py")}))
    with pytest.raises(ConfigError, match="gpt-fewshot"):
        system_prompt_for(make_settings(tmp_path, simulator={"style": "gpt-fewshot", "system_prompt_file": str(evil)}))
    # a bad prompt file stops the start (the layer is built from the settings)
    with pytest.raises(ConfigError):
        build_simulator(make_settings(tmp_path, simulator={"enabled": True, "system_prompt_file": str(tmp_path / "missing.py")}))


def test_builtin_prompt_warns_once_at_start(tmp_path, layout, caplog) -> None:
    from stabletoolbench_mirror.commands.serve import _warn_about_prompt

    builtin = make_settings(tmp_path, simulator={"enabled": True, "style": "mirrorapi-cot"})
    assert "trained on StableToolBench's SFT_SYSTEM / COT_SYSTEM" in (prompt_warning(builtin) or "")
    with caplog.at_level(logging.WARNING):
        _warn_about_prompt(builtin)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "system_prompt_file" in warnings[0].getMessage()
    assert system_prompt_for(builtin).source == "built-in"
    prompts_file = write_upstream_prompts(tmp_path / "p" / "system_prompts.py", layout)
    assert prompt_warning(make_settings(tmp_path, simulator={"enabled": True, "system_prompt_file": str(prompts_file)})) is None
    assert prompt_warning(make_settings(tmp_path, simulator={"enabled": True, "style": "gpt-fewshot"})) is None
    assert prompt_warning(make_settings(tmp_path, simulator={"enabled": False})) is None
    assert system_prompt_for(make_settings(tmp_path)).text == SFT_SYSTEM_PROMPT


def test_serve_logs_the_warning_once(tmp_path, reference_dir) -> None:
    from tests.helpers.processes import ServeProcess

    with OpenAIStub() as stub:
        config = {
            "store": {"path": str(tmp_path / "store")},
            "tools_folder": str(reference_dir / "toolenv" / "tools"),
            "simulator": {"enabled": True, "api_base": stub.api_base},
        }
        with ServeProcess(tmp_path, config) as server:
            health = requests.get(server.url + "/health", timeout=10).json()
        log = server.log.read_text()
    assert health["simulator_prompt"]["source"] == "built-in"
    assert log.count("trained on StableToolBench's SFT_SYSTEM / COT_SYSTEM") == 1, log
