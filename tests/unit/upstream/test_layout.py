"""The upstream tree layout's pure parts: name encoding, API paths and the streaming parse of one API file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabletoolbench_mirror.upstream import layout


@pytest.mark.parametrize("name", ["Get Weather", "tool_for_Data", "日本語", "a.b", "...x", "%", "a%20b"])
def test_a_plain_name_is_written_as_it_is(name: str) -> None:
    assert layout.encode_name(name) == name and layout.decode_name(name) == name


@pytest.mark.parametrize(
    ("name", "encoded"),
    [
        ("", "%%"),
        (".", "%%."),
        ("..", "%%.."),
        ("a/b", "%%a%2Fb"),
        ("a\\b", "%%a%5Cb"),
        ("tab\there", "%%tab%09here"),
        ("nul\x00", "%%nul%00"),
        ("%%marked", "%%%25%25marked"),
        ("50%/off", "%%50%25%2Foff"),
        ("lone\ud800", "%%lone%ED%A0%80"),
    ],
)
def test_a_name_that_cannot_be_a_file_name_is_encoded_and_decodes_back(name: str, encoded: str) -> None:
    assert layout.encode_name(name) == encoded
    assert layout.decode_name(encoded) == name


def test_a_name_too_long_once_encoded_cannot_be_written() -> None:
    assert layout.encode_name("x" * layout.MAX_NAME_BYTES) == "x" * layout.MAX_NAME_BYTES
    assert layout.encode_name("x" * (layout.MAX_NAME_BYTES + 1)) is None  # never cut: not written
    assert layout.encode_name("/" * (layout.MAX_NAME_BYTES // 3)) is None
    fits = "/" * ((layout.MAX_NAME_BYTES - 2) // 3)
    assert layout.encode_name(fits) is not None and len(layout.encode_name(fits).encode()) <= layout.MAX_NAME_BYTES  # type: ignore[union-attr]


def test_api_paths_stay_inside_their_root(tmp_path: Path) -> None:
    assert layout.api_path(tmp_path, "Data/movies_for_Data/Get Title") == tmp_path / "Data" / "movies_for_Data" / "Get Title.json"
    assert layout.api_path(tmp_path, "../x_for_y/..") == tmp_path / "%%.." / "x_for_y" / "%%...json"
    assert layout.api_path(tmp_path, "Data/a/b_for_Data/get") == tmp_path / "Data" / "%%a%2Fb_for_Data" / "get.json"
    assert layout.api_path(tmp_path, "nothing") is None
    assert layout.api_path(tmp_path, "Data/t/" + "/" * 200) is None


def test_a_tree_is_walked_sorted_with_its_names_decoded(tmp_path: Path) -> None:
    apis = ["B/t_for_B/z", "A/t_for_A/b", "A/t_for_A/a", "A/x/y_for_A/%%odd", "A/t_for_A/."]
    for api in apis:
        path = layout.api_path(tmp_path, api)
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        layout.write_cache_file(path, {"{'a': 1}": {"error": "", "response": api}})
    (tmp_path / "A" / "t_for_A" / "notes.txt").write_text("not an API file")
    (tmp_path / "loose.json").write_text("{}")  # not three levels deep
    found = list(layout.iter_cache_files(tmp_path))
    assert sorted(api for api, _ in found) == sorted(apis)
    assert [path for _, path in found] == sorted(path for _, path in found)
    assert all(layout.read_cache_file(path) == {"{'a': 1}": {"error": "", "response": api}} for api, path in found)
    assert list(layout.iter_cache_files(tmp_path / "missing")) == []


def test_symbolic_links_out_of_the_tree_are_refused_when_asked(tmp_path: Path) -> None:
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (outside / "t_for_C").mkdir(parents=True)
    (outside / "t_for_C" / "a.json").write_text("{}")
    tree.mkdir()
    (tree / "C").symlink_to(outside, target_is_directory=True)
    assert [api for api, _ in layout.iter_cache_files(tree)] == ["C/t_for_C/a"]
    refused: list[str] = []
    assert list(layout.iter_cache_files(tree, allow_symlinks=False, refused=refused)) == []
    assert len(refused) == 1 and "symbolic link out of" in refused[0] and "allow_symlinks: true" in refused[0]
    with pytest.raises(layout.OutsideTree):
        layout.check_inside(tree / "C", tree)
    layout.check_inside(tree, tree)


def test_spans_give_each_answer_its_text_and_served_body_in_file_order() -> None:
    text = '{\n    "b": {"error": "", "response": [1, 2]},\n    "a": {"error": "x", "response": "é"}\n}\n'
    spans = list(layout.iter_cache_spans(text))
    assert [(key, value) for key, value, *_ in spans] == [("b", {"error": "", "response": [1, 2]}), ("a", {"error": "x", "response": "é"})]
    assert [body for _, _, body, _, _ in spans] == ['{"error":"","response":[1,2]}', '{"error":"x","response":"é"}']
    assert [json.loads(text[start:end]) for *_, start, end in spans] == [value for _, value, *_ in spans]


def test_without_bodies_nothing_is_encoded_and_later_duplicates_win() -> None:
    text = '{"k": {"response": 1}, "k": {"response": 2}}'
    assert [body for _, _, body, _, _ in layout.iter_cache_spans(text, bodies=False)] == ["", ""]
    assert [value for _, value, *_ in layout.iter_cache_spans(text)][-1] == {"response": 2}
    assert list(layout.iter_cache_spans("  {  }  ")) == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[]", "not a JSON object of cache entries"),
        ("", "not a JSON object of cache entries"),
        ('{"a" 1}', "expected ':'"),
        ("{1: 2}", "expected a key"),
        ('{"a": 1 "b": 2}', "expected ',' or '}'"),
        ('{"a": }', "invalid JSON"),
        ('{"a": 1} x', "extra data after the JSON object"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"\\ud800": 1}', "a key contains a lone UTF-16 surrogate"),
        ('{"a": "\\udfff"}', "an answer contains a lone UTF-16 surrogate"),
    ],
)
def test_a_file_that_cannot_be_served_is_refused_naming_it(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="^cache/A/t/a.json: ") as caught:
        list(layout.iter_cache_spans(text, "cache/A/t/a.json"))
    assert why in str(caught.value)


def test_a_lone_surrogate_is_found_even_without_bodies_and_a_pair_is_served() -> None:
    with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
        list(layout.iter_cache_spans('{"a": "\\ud800"}', bodies=False))
    ((_, value, body, _, _),) = layout.iter_cache_spans('{"a": "\\ud83d\\ude00"}')
    assert value == body.strip('"') == "😀"


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match=f"^{path}: not UTF-8"):
        layout.read_cache_file(path)


def test_written_files_are_indented_like_upstreams_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    entries = {"{'q': 'é'}": {"error": "", "response": {"n": 1}}}
    layout.write_cache_file(path, entries)
    assert path.read_text(encoding="utf-8") == json.dumps(entries, indent=4, ensure_ascii=False) + "\n"
    assert list(layout.iter_cache_entries(path)) == [("{'q': 'é'}", entries["{'q': 'é'}"], '{"error":"","response":{"n":1}}')]
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
