"""The hit path's shortcuts (issue 24) keep every answer as it was.

* a body seen before skips its parse, but its answer is still looked up each time: a record the
  store gains, or a frozen file rewritten, is served to the very same bytes at once;
* the kept calls are bounded (count and body size);
* the lone-surrogate check done on all string fields at once still names the field;
* the counters of plain requests (counted through kept increments) add up as before;
* ``benchmarks/ceiling.py`` refuses to run without wrk, naming the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.protocol import VirtualRequest
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_store
from stabletoolbench_mirror.serving.prepared import PreparedCalls
from tests.helpers.paths import REPO

API = "Tools/t_for_Tools/a"


def body(tool_input: dict, **extra: str) -> bytes:
    return json.dumps({"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": json.dumps(tool_input),
                       "strip": "", "toolbench_key": "", **extra}).encode()


def post(server, data: bytes) -> requests.Response:
    return requests.post(server.url + "/virtual", data=data, headers={"Content-Type": "application/json"}, timeout=30)


def test_a_body_seen_before_is_still_looked_up_each_time(serve, settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    path = tree.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "frozen before"}}))
    settings = settings_factory(mode="replay", frozen_caches=[str(tree)])
    server = serve(settings)
    first, second = body({"a": 1}), body({"a": 2})
    a, b = post(server, first), post(server, first)
    assert (a.status_code, a.content, a.headers["x-stm-outcome"]) == (200, b.content, "hit")
    assert sorted((k, v) for k, v in a.headers.items() if k.lower() != "date") == \
        sorted((k, v) for k, v in b.headers.items() if k.lower() != "date")
    assert post(server, second).headers["x-stm-outcome"] == "unanswered"
    # the store gains the call: the same bytes are answered from it at once
    with build_store(settings) as store:
        store.add(Record.from_answer(API, "{'a': 2}", {"error": "", "response": "stored later"}, "simulated", "test"),
                  canonical_from_upstream_key("{'a': 2}"))
    r = post(server, second)
    assert (r.headers["x-stm-outcome"], r.json()["response"]) == ("hit", "stored later")
    # the frozen file is rewritten: the same bytes get the new answer
    before = path.stat().st_mtime_ns
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "frozen after"}}))
    os.utime(path, ns=(before + 10**9, before + 10**9))
    assert post(server, first).json()["response"] == "frozen after"


def test_bad_bodies_are_answered_alike_the_second_time(serve, settings_factory) -> None:
    server = serve(settings_factory(mode="replay"))
    for data in (b"{bad", b"[1]", json.dumps({"category": "x"}).encode(), body({"a": 1}, api_name="chat_with_user"), b"\xff"):
        a, b = post(server, data), post(server, data)
        assert (a.status_code, a.content) == (b.status_code, b.content)


def call(i: int) -> ToolCall:
    return ToolCall.of("Tools", "t", "a", {"i": i})


def test_the_kept_calls_are_bounded_oldest_first() -> None:
    kept = PreparedCalls(max_calls=3, max_body=100)
    for i in range(5):
        kept.put(b"body %d" % i, call(i))
    assert len(kept) == 3
    assert kept.get(b"body 0") is None and kept.get(b"body 1") is None
    assert kept.get(b"body 4") == call(4)
    kept.put(b"x" * 101, call(9))
    assert kept.get(b"x" * 101) is None and len(kept) == 3
    off = PreparedCalls(max_calls=0)
    off.put(b"b", call(1))
    assert len(off) == 0


@pytest.mark.parametrize("field", ["category", "tool_name", "api_name", "strip", "toolbench_key", "tool_input", "tool_input_dict"])
def test_a_lone_surrogate_in_any_field_is_refused_naming_it(field: str) -> None:
    payload = {"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": "{}", "strip": "", "toolbench_key": ""}
    if field == "tool_input_dict":
        payload["tool_input"] = {"q": "caf\u00e9 \ud800"}
        field = "tool_input"
    else:
        payload[field] = "x\ud800y"
    with pytest.raises(ValueError, match=f"{field} contains a lone UTF-16 surrogate"):
        VirtualRequest.model_validate(payload)
    payload[field] = "caf\u00e9 \U0001f600"
    VirtualRequest.model_validate(payload)


def test_plain_and_other_requests_add_up_in_stats(serve, settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    path = tree.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "x"}}))
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tree)]))
    for data in [body({"a": 1})] * 3 + [body({"a": 2})] * 2 + [b"{bad"]:
        post(server, data)
    stats = requests.get(server.url + "/stats", timeout=10).json()
    assert (stats["requests"], stats["hits"], stats["unanswered"], stats["rejected"]) == (6, 3, 2, 1)
    assert stats["by_source"] == {"frozen": 3}
    assert stats["by_api"][API] == {"hits": 3, "unanswered": 2, "misses": 2}
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert 'outcome="hit"} 3.0' in metrics


def test_the_ceiling_benchmark_refuses_without_wrk(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no wrk on it
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ceiling.py")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "wrk is not installed: apt-get install wrk" in proc.stderr
