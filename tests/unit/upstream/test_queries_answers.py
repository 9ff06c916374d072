"""Default calls from query files (names, typing) and the calls found in answer files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabletoolbench_mirror.upstream.answers import calls_in_answer, observation_text, query_id_of, read_answer_file
from stabletoolbench_mirror.upstream.queries import (
    ApiRef,
    FunctionIndex,
    QueryFileError,
    default_calls,
    default_input,
    function_name,
    schema_type,
    typed_default,
)
from tests.helpers.answer_files import api, cot_answer, dfs_answer, param, query


@pytest.mark.parametrize(
    "doc_type, default, expected",
    [
        ("NUMBER", "5", 5),
        ("NUMBER", " 25 ", 25),
        ("NUMBER", "-3", -3),
        ("NUMBER", "007", 7),
        ("NUMBER", "7.8", 7.8),
        ("NUMBER", "1e3", 1000.0),
        ("NUMBER", 46701, 46701),
        ("NUMBER", 40.7487727, 40.7487727),
        ("NUMBER", "abc", "abc"),
        ("NUMBER", "1,5", "1,5"),
        ("NUMBER", "nan", "nan"),
        ("NUMBER", [], []),
        ("BOOLEAN", "true", True),
        ("BOOLEAN", "False", False),
        ("BOOLEAN", "1", True),
        ("BOOLEAN", "0", False),
        ("BOOLEAN", False, False),
        ("BOOLEAN", "maybe", "maybe"),
        ("STRING", "5", "5"),
        ("STRING", " padded ", " padded "),
        ("STRING", 5, "5"),
        ("STRING", True, "true"),
        ("string", "1", "1"),
        ("number", "1", "1"),
        ("ENUM", "asc", "asc"),
        ("DATE (YYYY-MM-DD)", "2020-03-31", "2020-03-31"),
        ("ARRAY", "[]", "[]"),
        ("OBJECT", {"a": 1}, '{"a": 1}'),
    ],
)
def test_typed_default(doc_type, default, expected) -> None:
    got = typed_default(doc_type, default)
    assert got == expected and type(got) is type(expected)


def test_schema_type_is_the_clients_exact_map() -> None:
    assert [schema_type(t) for t in ("NUMBER", "STRING", "BOOLEAN", "string", "ENUM", None)] == [
        "integer",
        "string",
        "boolean",
        "string",
        "string",
        "string",
    ]


def test_default_input_standardises_names_types_values_and_drops_empty_defaults() -> None:
    doc = api(
        "Data",
        "Some Tool",
        "Get Thing",
        required=[param("id", "STRING", "tt1"), param("Page-Size", "NUMBER", "20"), param("from", "DATE (YYYY-MM-DD)", ""), param("q", "STRING", None)],
        optional=[param("verbose", "BOOLEAN", "true"), param("lang", "STRING", "")],
    )
    assert default_input(doc) == {"is_id": "tt1", "page_size": 20}
    full = default_input(doc, include_optional=True)
    assert full == {"is_id": "tt1", "page_size": 20, "verbose": True}
    # the key is the agent's: required first, in doc order
    assert str(full) == "{'is_id': 'tt1', 'page_size': 20, 'verbose': True}"


def test_default_input_rejects_malformed_parameters() -> None:
    with pytest.raises(ValueError):
        default_input({"required_parameters": [{"type": "STRING"}]})
    with pytest.raises(ValueError):
        default_input({"required_parameters": "x"})


def test_default_calls_keys_match_what_the_agent_sends(tmp_path: Path) -> None:
    doc = api("Data", "TheClique", "Transfermarkt search", required=[param("name", "STRING", "messi"), param("limit", "NUMBER", "5")])
    path = tmp_path / "G1.json"
    path.write_text(json.dumps([query(1, [doc]), query(2, [doc, {"category_name": "Data"}])]))
    calls, problems = default_calls([tmp_path])
    assert len(calls) == 2 and calls[0].call.key == calls[1].call.key
    call = calls[0].call
    assert call.api == "Data/theclique_for_Data/transfermarkt_search"
    # the agent's later call, as its arguments text, resolves to the same key
    from stabletoolbench_mirror.core.protocol import parse_tool_input

    agent_text = '{\n  "name": "messi",\n  "limit": 5\n}'
    assert str(parse_tool_input(agent_text)) == call.key == "{'name': 'messi', 'limit': 5}"
    assert len(problems) == 1 and "tool_name" in problems[0].message


def test_query_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(QueryFileError, match="bad.json"):
        default_calls([bad])
    obj = tmp_path / "obj.json"
    obj.write_text("{}")
    with pytest.raises(QueryFileError, match="query file"):
        default_calls([obj])
    with pytest.raises(QueryFileError, match="no such"):
        default_calls([tmp_path / "missing.json"])


def test_reference_query_files_give_one_default_call_per_api(reference_dir: Path) -> None:
    calls, problems = default_calls([reference_dir / "solvable_queries"])
    assert not problems
    distinct = {(c.call.api, c.call.canonical) for c in calls}
    apis = {c.call.api for c in calls}
    assert len(distinct) == len(apis) == 2490


def test_function_names_and_index() -> None:
    assert function_name("Get Info", "tool") == "get_info_for_tool"
    assert function_name("id", "tool") == "is_id_for_tool"
    long = function_name("a" * 70, "tool")
    assert len(long) == 64 and long.endswith("_for_tool")
    index = FunctionIndex()
    index.add_api(ApiRef("Data", "TheClique", "Songkick artist"), "7")
    index.add_api(ApiRef("Sports", "TheClique", "Songkick artist"), "8")
    ref, _ = index.resolve("songkick_artist_for_theclique", "7")
    assert ref == ApiRef("Data", "theclique", "songkick_artist")
    ref, reason = index.resolve("songkick_artist_for_theclique")
    assert ref is None and "ambiguous" in reason
    ref, reason = index.resolve("nope_for_theclique", "7")
    assert ref is None and "No such function" in reason


def test_index_from_tools_folder_uses_file_stem_as_tool_name(tmp_path: Path) -> None:
    folder = tmp_path / "tools" / "Data"
    folder.mkdir(parents=True)
    (folder / "my_tool.json").write_text(json.dumps({"tool_name": "My Tool!", "api_list": [{"name": "Get It"}]}))
    index = FunctionIndex()
    index.add_tools_folder(tmp_path / "tools")
    ref, _ = index.resolve("get_it_for_my_tool")
    assert ref == ApiRef("Data", "my_tool", "get_it")


def test_calls_in_dfs_answer_file(tmp_path: Path) -> None:
    calls = [
        ("transfermarkt_search_for_theclique", '{\n  "name": "Lionel Messi"\n}', '{"error": "", "response": "a"}'),
        ("songkick_artist_for_theclique", '{\n  "artist_id": "28003"\n}', '{"error": "", "response": "b"}'),
    ]
    branch = [("songkick_concert_for_theclique", '{"id_conc": "1"}', '{"error": "", "response": "c"}')]
    path = tmp_path / "588_DFS_woFilter_w2.json"
    path.write_text(json.dumps(dfs_answer("q", calls, extra_branch=branch), indent=2))
    found = read_answer_file(path)
    # tree calls (both branches) and train-message calls are the same calls: each once, Finish left out
    assert [(c.function, c.arguments, c.observation) for c in found] == calls + branch
    assert {c.query_id for c in found} == {"588"}
    assert query_id_of(path) == "588"


def test_calls_in_cot_answer_file_and_tool_calls_messages() -> None:
    calls = [("a_for_t", '{"x": 1}', "obs1"), ("a_for_t", '{"x": 1}', "obs1"), ("b_for_t", "not json", "obs2")]
    found = calls_in_answer(cot_answer("q", calls))
    assert [(c.function, c.arguments) for c in found] == [("a_for_t", '{"x": 1}'), ("b_for_t", "not json")]
    messages = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "x_for_t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "x_for_t", "content": "tool obs"},
    ]
    found = calls_in_answer({"answer_generation": {"train_messages": [messages]}})
    assert [(c.function, c.arguments, c.observation) for c in found] == [("x_for_t", "{}", "tool obs")]
    with pytest.raises(ValueError):
        calls_in_answer([1, 2])


def test_observation_text_is_the_clients_cut() -> None:
    assert observation_text({"error": "", "response": "x"}) == '{"error": "", "response": "x"}'
    long = observation_text({"error": "", "response": "y" * 2000})
    assert len(long) == 1024 + 3 and long.endswith("...")
