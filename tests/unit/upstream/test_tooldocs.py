"""The tool docs registry: exact lookups by standardised names, fuzzy fallback, missing docs."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from rapidfuzz import fuzz

from stabletoolbench_mirror.core.naming import resolve_names
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs


def write_tool(root: Path, category: str, stem: str, tool_name: str, apis: list[dict]) -> Path:
    path = root / category / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tool_name": tool_name, "tool_description": f"{tool_name} does things", "api_list": apis}))
    return path


def api(name: str, description: str = "", required: list | None = None) -> dict:
    return {
        "name": name,
        "description": description or f"{name} description",
        "method": "GET",
        "url": "https://example.invalid/" + name,
        "required_parameters": required or [],
        "optional_parameters": [{"name": "page", "type": "NUMBER", "description": "", "default": 1}],
    }


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    root = tmp_path / "tools"
    write_tool(root, "Data", "keyword_analysis", "Keyword Analysis", [api("PopularSitesForQuery"), api("Query Keywords")])
    write_tool(root, "Weather", "open_weather", "Open Weather", [api("Current Weather"), api("id")])
    write_tool(root, "Artificial_Intelligence_Machine_Learning", "ttskraken", "TTSKraken", [api("List Languages")])
    return root


def test_exact_lookup_by_request_names(tools: Path) -> None:
    docs = ToolDocs(tools)
    doc = docs.find(resolve_names("Data", "Keyword Analysis", "PopularSitesForQuery"))
    assert doc is not None and not doc.fuzzy
    assert (doc.name, doc.tool_name, doc.category) == ("PopularSitesForQuery", "Keyword Analysis", "Data")
    assert doc.optional_parameters[0]["name"] == "page"
    # a category with spaces/commas/slashes, an API named 'id' (change_name -> is_id)
    cat = "Artificial Intelligence/Machine Learning"
    assert docs.find(resolve_names(cat, "TTSKraken", "List Languages")).name == "List Languages"
    assert docs.find(resolve_names("Weather", "Open Weather", "id")).name == "id"
    # the agent's function name form: <api>_for_<tool>
    assert docs.find(resolve_names("Weather", "Open Weather", "current_weather_for_open_weather")).name == "Current Weather"


def test_fuzzy_fallback_is_logged(tools: Path, caplog: pytest.LogCaptureFixture) -> None:
    docs = ToolDocs(tools, fuzzy_score=85)
    with caplog.at_level(logging.INFO, logger="stabletoolbench_mirror.upstream.tooldocs"):
        doc = docs.find(resolve_names("Data", "Keyword Analysys", "PopularSiteForQuery"))
    assert doc is not None and doc.fuzzy and doc.name == "PopularSitesForQuery"
    assert "matched to 'keyword_analysis'" in caplog.text
    assert "matched to 'popularsitesforquery'" in caplog.text


def test_fuzzy_threshold_is_respected(tools: Path) -> None:
    names = resolve_names("Data", "Keyword Analysis", "PopularSiteForQuery")
    # the score of the misspelt name against the doc's, computed here the way a user would
    score = fuzz.ratio(names.api_name, "popularsitesforquery")
    assert 90 < score < 100
    # matched at any threshold up to its score, at none above it
    at = ToolDocs(tools, fuzzy_score=math.floor(score)).find(names)
    assert at is not None and at.fuzzy and at.name == "PopularSitesForQuery"
    assert ToolDocs(tools, fuzzy_score=math.ceil(score)).find(names) is None


def test_fuzzy_score_zero_takes_the_closest_api_of_the_tool(tools: Path) -> None:
    docs = ToolDocs(tools, fuzzy_score=0)
    near_keywords = docs.find(resolve_names("Data", "Keyword Analysis", "keywords"))
    assert near_keywords is not None and near_keywords.fuzzy
    assert (near_keywords.name, near_keywords.tool_name) == ("Query Keywords", "Keyword Analysis")
    near_sites = docs.find(resolve_names("Data", "Keyword Analysis", "sites"))
    assert near_sites is not None and (near_sites.name, near_sites.tool_name) == ("PopularSitesForQuery", "Keyword Analysis")


def test_tool_under_another_category(tools: Path) -> None:
    doc = ToolDocs(tools).find(resolve_names("Nonsense Category", "Open Weather", "Current Weather"))
    assert doc is not None and doc.category == "Weather"


def test_missing_and_broken_docs_are_not_errors(tools: Path, tmp_path: Path) -> None:
    (tools / "Data" / "broken.json").write_text("{not json")
    (tools / "Data" / "list.json").write_text("[1, 2]")
    docs = ToolDocs(tools, fuzzy_score=95)
    assert docs.find(resolve_names("Data", "broken", "anything")) is None
    assert docs.find(resolve_names("Data", "list", "anything")) is None
    assert docs.find(resolve_names("Nowhere", "Nothing", "none")) is None
    assert ToolDocs(tmp_path / "does-not-exist").find(resolve_names("Data", "x", "y")) is None


def test_index_lists_files_without_reading_them(tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = ToolDocs(tools)
    assert len(docs) == 3
    reads: list[Path] = []
    original = Path.read_text

    def counting(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if tools in self.parents:  # a tool file (another thread may read a package's metadata meanwhile)
            reads.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    for _ in range(5):
        docs.find(resolve_names("Data", "Keyword Analysis", "Query Keywords"))
    assert [p.name for p in reads] == ["keyword_analysis.json"]


def test_reference_tools_folder(reference_dir: Path, reference_calls: list) -> None:
    docs = ToolDocs(reference_dir / "toolenv" / "tools")
    found = 0
    for item in reference_calls:
        p = item["payload"]
        doc = docs.find(resolve_names(p["category"], p["tool_name"], p["api_name"]))
        if doc is not None:
            found += 1
            assert doc.fuzzy is False
    assert found == len(reference_calls)


def test_16000_tools_are_indexed_once_and_read_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    root = tmp_path / "big"
    body = json.dumps({"tool_name": "T", "tool_description": "", "api_list": [api("Get Item")]})
    for c in range(40):
        folder = root / f"Category {c}"
        folder.mkdir(parents=True)
        for i in range(400):
            (folder / f"tool_{c}_{i}.json").write_text(body)
    reads: list[Path] = []
    original = Path.read_text

    def counting(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if root in self.parents:  # a tool file (another thread may read a package's metadata meanwhile)
            reads.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    docs = ToolDocs(root)
    start = time.perf_counter()
    assert len(docs) == 16_000
    assert time.perf_counter() - start < 3.0  # a directory listing, no file is parsed
    assert reads == []
    for _ in range(3):
        assert docs.find(resolve_names("Category 7", "tool_7_123", "Get Item")).name == "Get Item"
        assert docs.find(resolve_names("Category 39", "tool_39_0", "get_item")).name == "Get Item"
    assert sorted(p.name for p in reads) == ["tool_39_0.json", "tool_7_123.json"]


def test_a_registered_tool_is_found_like_a_files_and_listed(tmp_path: Path) -> None:
    doc = {"tool_name": "API-Bank", "tool_description": "runs here", "api_list": [{"name": "AddAgenda", "description": "adds"}]}
    for docs in (ToolDocs(None), ToolDocs(tmp_path)):
        docs.register("APIBank", doc)
        found = docs.find_by_names("APIBank", "api_bank", "addagenda")
        assert found is not None and found.name == "AddAgenda" and found.tool_description == "runs here"
        assert list(docs.tools()) == [("APIBank", "api_bank", doc)]
    (tmp_path / "APIBank").mkdir()
    (tmp_path / "APIBank" / "api_bank.json").write_text('{"tool_name": "API-Bank", "api_list": [{"name": "Other"}]}')
    docs = ToolDocs(tmp_path)
    assert docs.find_by_names("APIBank", "api_bank", "other") is not None  # the file, before any registration
    docs.register("APIBank", doc)  # registered after the index was built: it wins
    assert docs.find_by_names("APIBank", "api_bank", "addagenda") is not None
