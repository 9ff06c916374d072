"""The "Cache keys" lookup order of docs/cache-keys.md, rule by rule, over real HTTP.

Each test sets up the same call in two places with different answers, so that looking
in the wrong order serves the wrong answer:

* the exact upstream key is tried in every tier before the canonical key in any tier;
* within a step the store comes first, then the frozen caches in their listed order;
* a frozen file is read again after it changes on disk.

Both store kinds run: diskcache hits take the layer's sync lookup, Redis hits its async one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_store
from tests.helpers.redis_server import RedisServer, redis_prefix, redis_server  # noqa: F401

API = "Tools/t_for_Tools/a"


@pytest.fixture(params=["diskcache", pytest.param("redis", marks=pytest.mark.redis)])
def store_config(request, tmp_path: Path) -> dict[str, Any]:
    if request.param == "diskcache":
        return {"kind": "diskcache", "path": str(tmp_path / "store")}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"kind": "redis", "url": server.url, "prefix": request.getfixturevalue("redis_prefix")}


def answer(text: str) -> dict[str, str]:
    return {"error": "", "response": text}


def payload(tool_input: dict[str, Any]) -> dict[str, str]:
    return {"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": json.dumps(tool_input), "strip": "", "toolbench_key": ""}


def write_tree(root: Path, entries: dict[str, dict[str, str]]) -> Path:
    """An upstream ``tool_response_cache`` tree holding ``entries`` (upstream key -> answer) for :data:`API`."""
    path = root.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def fill_store(settings, entries: dict[str, str]) -> None:
    """Store ``entries`` (upstream key -> answer text) in this order, as recorded answers."""
    with build_store(settings) as store:
        for key, text in entries.items():
            store.add(Record.from_answer(API, key, answer(text), "simulated", "test"), canonical_from_upstream_key(key))


@pytest.fixture
def mirror(serve, settings_factory, store_config, tmp_path: Path):
    """A replay server over the test's store and frozen trees (a miss is never filled)."""

    def start(store: dict[str, str], *trees: dict[str, dict[str, str]]):
        roots = [str(write_tree(tmp_path / f"tree{i}", t).parents[2]) for i, t in enumerate(trees)]
        settings = settings_factory(mode="replay", store=store_config, frozen_caches=roots)
        fill_store(settings, store)
        return serve(settings)

    return start


def served(server, tool_input: dict[str, Any]) -> tuple[str, str, str]:
    """``(response text, X-STM-Outcome, X-STM-Source)`` for one call."""
    r = server.post(payload(tool_input))
    assert r.status_code == 200, r.text
    return r.json()["response"], r.headers["x-stm-outcome"], r.headers.get("x-stm-source", "")


def test_exact_key_before_canonical_key_in_one_tier(mirror) -> None:
    # two entries with one canonical key: the canonical pointer names the first one stored
    server = mirror({"{'a': 1, 'b': 2}": "stored as a,b", "{'b': 2, 'a': 1}": "stored as b,a"})
    assert served(server, {"b": 2, "a": 1}) == ("stored as b,a", "hit", "simulated")
    assert served(server, {"a": 1, "b": 2}) == ("stored as a,b", "hit", "simulated")


def test_exact_key_in_any_tier_before_canonical_key_in_the_store(mirror) -> None:
    # the store has the call only under another key order, the frozen cache under this one
    server = mirror({"{'b': 2, 'a': 1}": "store, b,a"}, {"{'a': 1, 'b': 2}": answer("frozen, a,b")})
    assert served(server, {"a": 1, "b": 2}) == ("frozen, a,b", "hit", "frozen")
    assert served(server, {"b": 2, "a": 1}) == ("store, b,a", "hit", "simulated")


def test_store_before_frozen_caches_for_the_exact_key(mirror) -> None:
    server = mirror({"{'a': 1}": "from the store"}, {"{'a': 1}": answer("from the frozen cache")})
    assert served(server, {"a": 1}) == ("from the store", "hit", "simulated")


def test_store_before_frozen_caches_for_the_canonical_key(mirror) -> None:
    # upstream keys are plain strings: "{'b':2, 'a':1}" is no exact key of any call, but has its canonical key
    server = mirror({"{'b': 2, 'a': 1}": "from the store"}, {"{'b':2, 'a':1}": answer("from the frozen cache")})
    assert served(server, {"a": 1, "b": 2}) == ("from the store", "hit", "simulated")


def test_frozen_caches_in_their_listed_order(mirror) -> None:
    first = {"{'a': 1}": answer("first tree"), "{'b':2, 'a':1}": answer("first tree, canonical")}
    second = {"{'a': 1}": answer("second tree"), "{'a':1, 'b':2}": answer("second tree, canonical")}
    server = mirror({}, first, second)
    assert served(server, {"a": 1}) == ("first tree", "hit", "frozen")
    assert served(server, {"a": 1, "b": 2}) == ("first tree, canonical", "hit", "frozen")


def test_frozen_caches_in_their_listed_order_reversed(mirror) -> None:
    first = {"{'a': 1}": answer("first tree")}
    second = {"{'a': 1}": answer("second tree")}
    server = mirror({}, second, first)
    assert served(server, {"a": 1}) == ("second tree", "hit", "frozen")


def test_a_frozen_file_is_read_again_after_it_changes(mirror, tmp_path: Path) -> None:
    server = mirror({}, {"{'a': 1}": answer("before")})
    path = tmp_path.joinpath("tree0", *API.split("/")).with_suffix(".json")
    assert served(server, {"a": 1}) == ("before", "hit", "frozen")
    assert served(server, {"a": 2})[1] == "unanswered"
    before = path.stat().st_mtime_ns
    path.write_text(json.dumps({"{'a': 1}": answer("after"), "{'a': 2}": answer("added")}), encoding="utf-8")
    # a file system with coarse timestamps could keep the old time: make the change visible
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))
    assert served(server, {"a": 1}) == ("after", "hit", "frozen")
    assert served(server, {"a": 2}) == ("added", "hit", "frozen")


def test_a_sessions_call_is_read_in_the_frozen_caches_with_upstreams_keys_last_and_never_so_in_the_store(mirror) -> None:
    """Inside a session a call's keys carry the history hash, which no frozen tree has: after its own keys, the call
    is read in the frozen caches with the keys StableToolBench's client gives it (exact, then canonical); a record
    the store holds for the call outside any session is no answer inside one (it was made without the history)."""
    import requests

    server = mirror({"{'s': 1}": "store, outside any session"},
                    {"{'a': 1}": answer("frozen, exact"), "{'c':2, 'd':1}": answer("frozen, canonical"), "{'s': 1}": answer("frozen s")})
    session = requests.post(server.url + "/sessions", json={"task": "t"}, timeout=10).json()["id"]

    def in_session(tool_input: dict[str, Any]) -> tuple[str, str, str]:
        r = server.post(payload(tool_input), headers={"X-STM-Session": session})
        assert r.status_code == 200, r.text
        return r.json()["response"], r.headers["x-stm-outcome"], r.headers.get("x-stm-source", "")

    assert in_session({"a": 1}) == ("frozen, exact", "hit", "frozen")
    assert in_session({"d": 1, "c": 2}) == ("frozen, canonical", "hit", "frozen")
    assert in_session({"s": 1}) == ("frozen s", "hit", "frozen")  # not the store's sessionless record
    assert in_session({"z": 9})[1] == "unanswered"
    assert served(server, {"s": 1}) == ("store, outside any session", "hit", "simulated")  # outside: the store first
    calls = requests.get(f"{server.url}/sessions/{session}", timeout=10).json()["calls"]
    assert [(c["source"], c["in_history"]) for c in calls] == [("frozen", True)] * 3 + [(None, False)]
