"""Property-based fuzzing of ``POST /virtual`` through the real HTTP server (hypothesis).

Whatever the body: never a 5xx, always a JSON ``{"error", "response"}`` answer, and no
file written or changed anywhere but the store folder (the test's temp folder and the
working tree are compared before and after).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.engine.stats import COUNTER_NAMES
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache
from tests.helpers import paths
from tests.helpers.responders import KeyedResponder, expected_answer

REPO = paths.REPO
SKIP_IN_REPO = {".git", ".venv", ".hypothesis", ".pytest_cache", "__pycache__"}
FIELDS = ("category", "tool_name", "api_name", "tool_input", "strip", "toolbench_key")
ALLOWED = {200, 400, 404, 405, 413, 422}

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _tree(root: Path, skip: set[str], exclude: Path | None = None) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip and (exclude is None or Path(dirpath, d) != exclude)]
        for name in files:
            p = Path(dirpath, name)
            try:
                st_ = p.stat()
            except FileNotFoundError:
                continue
            out[str(p)] = (st_.st_size, st_.st_mtime_ns)
    return out


class Target:
    def __init__(self, url: str) -> None:
        self.url = url + "/virtual"
        self.session = requests.Session()
        self.posts = 0

    def post_bytes(self, body: bytes) -> requests.Response:
        self.posts += 1
        return self.session.post(self.url, data=body, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.fixture
def target(tmp_path: Path, serve, settings_factory) -> Iterator[Target]:
    frozen = tmp_path / "frozen" / "Tools" / "t_for_Tools"
    frozen.mkdir(parents=True)
    (frozen / "a.json").write_text(json.dumps({"{}": {"error": "", "response": "x"}}))
    store_dir = tmp_path / "store"
    settings = settings_factory(mode="record", frozen_caches=[str(tmp_path / "frozen")])
    layer = MirrorLayer(DiskcacheStore(store_dir), frozen=[FrozenCache(tmp_path / "frozen")], responders=[KeyedResponder()])
    server = serve(settings, layer)
    before_tmp = _tree(tmp_path, set(), exclude=store_dir)
    before_repo = _tree(REPO, SKIP_IN_REPO)
    target = Target(server.url)
    yield target
    assert _tree(tmp_path, set(), exclude=store_dir) == before_tmp, "a request wrote outside the store folder"
    assert _tree(REPO, SKIP_IN_REPO) == before_repo, "a request wrote into the working tree"
    # every request was counted once, and the store holds exactly the answers recorded, each whole and right
    stats = requests.get(server.url + "/stats", timeout=30).json()
    assert stats["requests"] == target.posts == sum(stats[name] for name in COUNTER_NAMES.values())
    records = list(layer.store)
    assert len(records) == stats["recorded"]
    for record in records:
        assert record.source == "simulated" and record.answer == expected_answer(record.api, record.key), record


def check(r: requests.Response) -> None:
    assert r.status_code < 500 and r.status_code in ALLOWED, (r.status_code, r.text[:300])
    data = r.json()
    assert isinstance(data, dict) and set(data) == {"error", "response"}, r.text[:300]
    assert isinstance(data["error"], str)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4), max_leaves=20)
hostile_text = st.sampled_from(["", "..", "../../etc/passwd", "/", "\\..\\", "\x00", "a/b", "Tools", "t", "chat_with_user",
                                "con", "é日本", "x" * 300, "{", "%2e%2e", "~root", '{"a": "\\ud800"}']) | st.text(max_size=60)
# lone surrogates (json.dumps writes them as "\udXXX" escapes)
hostile_text = hostile_text | st.text(st.characters(categories=["Cs", "Ll", "Nd"]), min_size=1, max_size=6)
tool_inputs = (
    st.builds(json.dumps, st.dictionaries(st.text(max_size=12), json_values, max_size=5))
    | st.builds(json.dumps, json_values)
    | hostile_text
    | st.dictionaries(st.text(max_size=12), json_values, max_size=5)
)
field_values = {
    "category": hostile_text | json_values,
    "tool_name": hostile_text | json_values,
    "api_name": hostile_text | json_values,
    "tool_input": tool_inputs | json_values,
    "strip": hostile_text | json_values,
    "toolbench_key": hostile_text,
}


@st.composite
def near_valid(draw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name in FIELDS:
        if draw(st.integers(0, 9)) == 0:
            continue  # a missing field now and then
        strategy = field_values[name] if draw(st.booleans()) else hostile_text
        body[name] = draw(strategy)
    body.update(draw(st.dictionaries(st.text(max_size=10), json_values, max_size=2)))
    return body


@FUZZ
@given(body=near_valid())
def test_near_valid_payloads(target: Target, body: dict[str, Any]) -> None:
    check(target.post_bytes(json.dumps(body).encode()))


names = st.text(st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1, max_size=30)
valid_bodies = st.fixed_dictionaries({
    "category": names, "tool_name": names, "api_name": names,
    "tool_input": st.builds(json.dumps, st.dictionaries(st.text(max_size=12), json_values, max_size=5)),
    "strip": st.just(""), "toolbench_key": st.just(""),
})


@FUZZ
@given(body=valid_bodies)
def test_valid_payloads_are_answered_and_recorded(target: Target, body: dict[str, Any]) -> None:
    r = target.post_bytes(json.dumps(body).encode())
    check(r)
    # a valid body is answered (recorded, or found: an earlier example may have made the same call)
    assert r.status_code == 200 and r.headers["x-stm-outcome"] in {"recorded", "hit", "local"}, (r.headers, r.text[:300])


@FUZZ
@given(value=json_values)
def test_any_json_value(target: Target, value: Any) -> None:
    check(target.post_bytes(json.dumps(value).encode()))


@FUZZ
@given(raw=st.binary(max_size=3000) | st.builds(lambda s: s.encode("utf-8", "surrogatepass"), st.text(max_size=500)))
def test_raw_bytes(target: Target, raw: bytes) -> None:
    check(target.post_bytes(raw))
