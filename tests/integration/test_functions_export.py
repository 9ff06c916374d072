"""``tools export``: the functions are StableToolBench's own, for every solvable query, and clean for MCP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.commands.cli import main
from stabletoolbench_mirror.upstream.functions import CLASH_KEEP, Function, Target, clash_name, unique_names
from tests.helpers.paths import REPO


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_solvable_query_gets_exactly_upstreams_functions(reference_dir: Path, tmp_path: Path) -> None:
    upstream = reference_dir / "stabletoolbench"
    if not (upstream / "toolbench/inference/Downstream_tasks/rapidapi.py").is_file():
        pytest.skip("StableToolBench's rapidapi.py is not in the reference checkout")
    queries = sorted((reference_dir / "solvable_queries").glob("*.json"))
    tools = reference_dir / "toolenv/tools"
    run = subprocess.run(
        [sys.executable, str(REPO / "tests/helpers/upstream_functions.py"), str(upstream), str(tools), *map(str, queries)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    theirs = {(d["group"], d["query_id"]): d["functions"] for d in map(json.loads, run.stdout.splitlines())}
    out = tmp_path / "functions.jsonl"
    assert main(["tools", "export", "--queries", str(reference_dir / "solvable_queries"), "--tools", str(tools), "-q", str(out)]) == 0
    ours = _lines(out)
    assert len(ours) == len(theirs) == 765
    for line in ours:
        assert line["functions"] == theirs[(line["group"], line["query_id"])], (line["group"], line["query_id"])
        assert line["functions"][-1]["function"]["name"] == "Finish"
        # the map names the API each function reaches, as the client's payload names it
        for fn in line["functions"][:-1]:
            assert set(line["apis"][fn["function"]["name"]]) == {"category", "tool_name", "api_name"}


def _tools_folder(root: Path) -> Path:
    tool = {
        "tool_name": "Weather Now!",
        "tool_description": "",
        "api_list": [
            {"name": "Current", "description": "  Current gives the weather  ", "method": "GET",
             "required_parameters": [{"name": "City-Name", "type": "STRING", "description": "d" * 300, "default": "Paris"}],
             "optional_parameters": [{"name": "id", "type": "NUMBER", "description": "", "default": None},
                                     {"name": "units", "type": "ENUM", "description": "u", "default": ""}]},
            {"name": "Alerts", "description": "", "method": "GET", "required_parameters": [],
             "optional_parameters": [{"name": "region", "type": "STRING", "description": "r", "default": "EU"}]},
        ],
    }
    (root / "Weather").mkdir(parents=True)
    (root / "Weather" / "weather_now.json").write_text(json.dumps(tool), encoding="utf-8")
    return root


def test_upstreams_rules_and_the_clean_mcp_schema(tmp_path: Path) -> None:
    tools = _tools_folder(tmp_path / "tools")
    query = {"query": "q", "query_id": 7, "api_list": [
        {"category_name": "Weather", "tool_name": "Weather Now!", "api_name": "Current"},
        {"category_name": "Weather", "tool_name": "Weather Now!", "api_name": "Alerts"},
    ]}
    (tmp_path / "queries").mkdir()
    (tmp_path / "queries" / "G9.json").write_text(json.dumps([query]), encoding="utf-8")
    out = tmp_path / "f.jsonl"
    assert main(["tools", "export", "--queries", str(tmp_path / "queries" / "G9.json"), "--tools", str(tools), "-q", str(out)]) == 0
    [line] = _lines(out)
    assert (line["group"], line["query_id"]) == ("G9", "7")
    current, alerts, finish = (f["function"] for f in line["functions"])
    assert current["name"] == "current_for_weather_now"
    assert current["description"] == ('This is the subfunction for tool "weather_now", you can use this tool.'
                                      'The description of this function is: "current_for_weather_now gives the weather"')
    assert current["parameters"] == {
        "type": "object",
        "properties": {
            "city_name": {"type": "string", "description": "d" * 256, "example_value": "Paris"},
            "is_id": {"type": "integer", "description": "", "example_value": None},  # str(None) is not empty
            "units": {"type": "string", "description": "u"},
        },
        "required": ["", "city_name"],
        "optional": ["", "is_id", "units"],
    }
    # upstream shows optional parameters only beside required ones
    assert alerts["parameters"] == {"type": "object", "properties": {}, "required": [""], "optional": [""]}
    assert alerts["description"] == 'This is the subfunction for tool "weather_now", you can use this tool.'
    assert finish["name"] == "Finish"
    assert line["apis"]["current_for_weather_now"] == {"category": "Weather", "tool_name": "weather_now", "api_name": "current"}

    mcp_out = tmp_path / "m.jsonl"
    assert main(["tools", "export", "--queries", str(tmp_path / "queries"), "--tools", str(tools), "--format", "mcp", "-q", str(mcp_out)]) == 0
    [mline] = _lines(mcp_out)
    assert [t["name"] for t in mline["functions"]] == ["current_for_weather_now", "alerts_for_weather_now", "Finish"]
    assert mline["functions"][0]["inputSchema"] == {
        "type": "object",
        "properties": {
            "city_name": {"type": "string", "description": "d" * 256, "examples": ["Paris"]},
            "is_id": {"type": "integer", "description": "", "examples": [None]},
            "units": {"type": "string", "description": "u"},
        },
        "required": ["city_name"],
    }
    assert mline["functions"][1]["inputSchema"] == {"type": "object", "properties": {}}


def test_a_name_given_to_two_apis_gets_a_suffix_of_its_own_api() -> None:
    def fn(name: str, target: Target) -> Function:
        return Function({"function": {"name": name}}, target)

    a, b, c = Target("Sports", "t", "a"), Target("Media", "t", "a"), Target("Data", "u", "x")
    named = unique_names([fn("a_for_t", a), fn("a_for_t", b), fn("x_for_u", c), fn("a_for_t", a)])
    assert set(named) == {clash_name("a_for_t", a), clash_name("a_for_t", b), "x_for_u"}
    assert clash_name("a_for_t", a) == "a_for_t__" + __import__("hashlib").sha256(b"Sports/t/a").hexdigest()[:6]
    long = "x" * 64
    assert len(clash_name(long, a)) == 64 and clash_name(long, a).startswith("x" * CLASH_KEEP + "__")
    # the suffix depends on the API alone, not on what is listed beside it
    assert unique_names([fn("a_for_t", b), fn("a_for_t", a)]) .keys() == {clash_name("a_for_t", a), clash_name("a_for_t", b)}


def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = _tools_folder(tmp_path / "tools")
    out = tmp_path / "f.jsonl"
    assert main(["tools", "export", "--queries", str(tmp_path / "missing.json"), "--tools", str(tools), "-q", str(out)]) == 2
    assert "missing.json: no such file or folder" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    assert main(["tools", "export", "--queries", str(tmp_path / "bad.json"), "--tools", str(tools), "-q", str(out)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["tools", "export", "--queries", str(tmp_path / "bad.json"), "--tools", str(tmp_path / "nope"), "-q", str(out)]) == 2
    assert f"error: tools folder: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.glob("f.jsonl*")) == []
