"""Bad input gets a 4xx or a clear error answer, never a 500, and writes nothing outside the store."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import requests


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath, name)
            st = p.stat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def guarded(tmp_path: Path, serve, settings_factory):
    """A record-mode server whose store lives in tmp/store; yields (server, snapshot-of-everything-else)."""
    frozen = tmp_path / "frozen" / "Tools" / "t_for_Tools"
    frozen.mkdir(parents=True)
    (frozen / "a.json").write_text(json.dumps({"{}": {"error": "", "response": "x"}}))
    server = serve(settings_factory(mode="record", frozen_caches=[str(tmp_path / "frozen")]))
    outside = tmp_path.parent
    # an earlier test's SQLite connections still waiting for garbage collection would checkpoint their
    # store (in a sibling folder) during this test: let them go first
    gc.collect()
    before = {k: v for k, v in _tree(outside).items() if not k.startswith(str(tmp_path / "store"))}
    yield server
    after = {k: v for k, v in _tree(outside).items() if not k.startswith(str(tmp_path / "store"))}
    assert after == before, "a request wrote outside the store folder"


GOOD = {"category": "Tools", "tool_name": "T", "api_name": "A", "tool_input": "{}", "strip": "", "toolbench_key": ""}


@pytest.mark.parametrize(
    "body, status",
    [
        (b"not json at all", 400),
        (b"\xff\xfe\x00garbage", 400),  # not UTF-8
        (b'{"category": "Tools", "tool_name": "T", "api_name": "A", "tool_input": "\xff"}', 400),
        (b"[1, 2, 3]", 422),
        (b'"just a string"', 422),
        (b"{}", 422),  # every field missing
        (json.dumps({k: v for k, v in GOOD.items() if k != "api_name"}).encode(), 422),
        (json.dumps({**GOOD, "category": 5}).encode(), 422),
        (json.dumps({**GOOD, "tool_name": None}).encode(), 422),
        (json.dumps({**GOOD, "tool_input": [1, 2]}).encode(), 422),
        (json.dumps({**GOOD, "strip": {"a": 1}}).encode(), 422),
        (b"[" * 100_000 + b"]" * 100_000, 400),  # nesting bomb
        (json.dumps({**GOOD, "tool_input": json.dumps({"q": "x" * 2_000_000})}).encode(), 413),  # huge tool_input
    ],
)
def test_bad_bodies_get_4xx_with_json_error(guarded, body: bytes, status: int) -> None:
    r = requests.post(guarded.url + "/virtual", data=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text[:300]
    data = r.json()
    assert set(data) == {"error", "response"} and data["error"]


def test_huge_body_without_content_length_is_refused(guarded) -> None:
    def chunks():
        for _ in range(300):
            yield b"x" * 10_000

    r = requests.post(guarded.url + "/virtual", data=chunks(), timeout=30)  # chunked transfer, no Content-Length
    assert r.status_code == 413


@pytest.mark.parametrize(
    "fields",
    [
        {"category": "../../etc", "tool_name": "passwd", "api_name": "x"},
        {"category": "..", "tool_name": "..", "api_name": ".."},
        {"category": "Tools", "tool_name": "../../../../tmp/evil_for_Tools", "api_name": "x"},
        {"category": "Tools", "tool_name": "t", "api_name": "../../a"},
        {"category": "/", "tool_name": "\\..\\..", "api_name": "%00"},
        {"category": "C" * 1024, "tool_name": "T" * 1024, "api_name": "A" * 1024},  # the longest accepted
        {"category": "", "tool_name": "", "api_name": ""},
    ],
)
def test_hostile_names_are_plain_misses(guarded, fields: dict) -> None:
    r = guarded.post({**GOOD, **fields, "tool_input": '{"a": 1}'})
    assert r.status_code == 200
    assert r.json()["error"] == "API not working error..."


def test_odd_but_valid_inputs(guarded) -> None:
    for tool_input in ('"a string"', "123", "null", '{"nested": {"deep": [1, {"x": null}]}}', '{"ü": "日本"}'):
        r = guarded.post({**GOOD, "tool_input": tool_input})
        assert r.status_code == 200
        assert set(r.json()) == {"error", "response"}
    r = guarded.post({**GOOD, "extra_field": "ignored", "tool_input": "{}"})
    assert r.json() == {"error": "", "response": "x"}


def test_wrong_methods_and_paths_are_4xx(guarded) -> None:
    assert requests.get(guarded.url + "/virtual", timeout=5).status_code == 405
    assert requests.post(guarded.url + "/nope", json=GOOD, timeout=5).status_code == 404
