"""The /virtual endpoint's upstream-compatible behaviour, over real HTTP."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from stabletoolbench_mirror.snapshots.tree_import import import_tree


def _payload(p: dict, tool_input=None) -> dict:
    out = dict(p)
    if tool_input is not None:
        out["tool_input"] = tool_input
    return out


def test_replay_reference_calls_from_frozen_layer(reference_dir: Path, reference_calls, serve, settings_factory) -> None:
    """Every recorded call, replayed through HTTP against the reference cache, gives exactly what the agent saw."""
    server = serve(settings_factory(mode="replay", frozen_caches=[str(reference_dir / "cache")]))
    for call in reference_calls:
        r = server.post(call["payload"])
        assert r.status_code == 200
        assert r.json() == call["observed"]
        # key order of the answer is upstream's too (error first), as json.dumps would show the agent
        assert json.dumps(r.json()) == json.dumps(call["observed"])
    stats = server_stats(server)
    assert stats["hits"] == len(reference_calls) and stats["misses"] == 0


def test_replay_reference_calls_with_shuffled_input_order(reference_dir: Path, reference_calls, serve, settings_factory) -> None:
    server = serve(settings_factory(mode="replay", frozen_caches=[str(reference_dir / "cache")]))
    rng = random.Random(7)
    reordered = 0
    for call in reference_calls:
        original = list(json.loads(call["payload"]["tool_input"]).items())
        items = original[:]
        while len(items) > 1 and items == original:
            rng.shuffle(items)
        reordered += items != original
        r = server.post(_payload(call["payload"], json.dumps(dict(items), indent=2)))
        assert r.json() == call["observed"]
    assert reordered >= 4  # the calls with more than one argument


def test_replay_reference_calls_from_imported_store(reference_dir: Path, reference_calls, serve, settings_factory, tmp_path: Path) -> None:
    settings = settings_factory(mode="replay")
    from stabletoolbench_mirror.factory import build_store

    with build_store(settings) as store:
        summary = import_tree(store, reference_dir / "cache", progress=False)
    assert summary.added == summary.entries > 0
    server = serve(settings)
    for call in reference_calls:
        assert server.post(call["payload"]).json() == call["observed"]
        items = list(json.loads(call["payload"]["tool_input"]).items())[::-1]
        assert server.post(_payload(call["payload"], json.dumps(dict(items)))).json() == call["observed"]


def test_tool_input_as_object_and_empty_string(serve, settings_factory, tmp_path: Path) -> None:
    frozen = tmp_path / "frozen" / "Tools" / "t_for_Tools"
    frozen.mkdir(parents=True)
    (frozen / "a.json").write_text(json.dumps({"{}": {"error": "", "response": "empty"}, "{'x': 1}": {"error": "", "response": "one"}}))
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "frozen")]))
    base = {"category": "Tools", "tool_name": "T", "api_name": "A", "strip": "", "toolbench_key": ""}
    assert server.post({**base, "tool_input": ""}).json() == {"error": "", "response": "empty"}
    assert server.post({**base, "tool_input": "{}"}).json() == {"error": "", "response": "empty"}
    assert server.post({**base, "tool_input": {"x": 1}}).json() == {"error": "", "response": "one"}


def test_parse_error_and_chat_with_user(serve, settings_factory) -> None:
    server = serve(settings_factory(mode="replay"))
    base = {"category": "Tools", "tool_name": "T", "api_name": "A", "strip": "", "toolbench_key": ""}
    r = server.post({**base, "tool_input": "{broken"})
    assert r.status_code == 200 and r.json() == {"error": "Tool input parse error...\n", "response": ""}
    r = server.post({**base, "api_name": "chat_with_user", "tool_input": "{broken"})
    assert r.json() == {"error": "", "response": "Chat with user."}
    r = server.post({**base, "api_name": "Chat With User", "tool_input": "{}"})
    assert r.json() == {"error": "", "response": "Chat with user."}


@pytest.mark.parametrize("mode", ["replay", "record"])
def test_miss_without_responders_is_an_error_answer_counted_and_not_recorded(mode: str, serve, settings_factory) -> None:
    settings = settings_factory(mode=mode)
    server = serve(settings)
    payload = {"category": "Tools", "tool_name": "T", "api_name": "A", "tool_input": '{"q": 1}', "strip": "", "toolbench_key": ""}
    r = server.post(payload)
    assert r.status_code == 200
    assert r.json()["error"] == "API not working error..."
    assert "Tools/t_for_Tools/a" in r.json()["response"]
    stats = server_stats(server)
    assert stats["misses"] == 1 and stats["unanswered"] == 1 and stats["recorded"] == 0
    assert stats["by_api"]["Tools/t_for_Tools/a"]["misses"] == 1
    assert len(server_layer_store(settings)) == 0


def test_health_and_stats_shape(serve, settings_factory) -> None:
    import requests

    server = serve(settings_factory(mode="replay"))
    health = requests.get(server.url + "/health", timeout=5).json()
    assert health["status"] == "ok" and health["mode"] == "replay" and health["store"] == "diskcache"
    stats = requests.get(server.url + "/stats", timeout=5).json()
    for key in ("requests", "hits", "misses", "by_source", "by_api"):
        assert key in stats


def test_bearer_token_required_on_every_endpoint(serve, settings_factory) -> None:
    import requests

    server = serve(settings_factory(mode="replay", auth_token="s3cret-token"))
    payload = {"category": "Tools", "tool_name": "T", "api_name": "chat_with_user", "tool_input": "{}"}
    for method, path in (("post", "/virtual"), ("get", "/health"), ("get", "/stats")):
        kwargs = {"json": payload} if method == "post" else {}
        assert getattr(requests, method)(server.url + path, timeout=5, **kwargs).status_code == 401
        bad = getattr(requests, method)(server.url + path, timeout=5, headers={"Authorization": "Bearer nope"}, **kwargs)
        assert bad.status_code == 401 and "s3cret" not in bad.text
        ok = getattr(requests, method)(server.url + path, timeout=5, headers={"Authorization": "Bearer s3cret-token"}, **kwargs)
        assert ok.status_code == 200


def server_stats(server) -> dict:
    import requests

    return requests.get(server.url + "/stats", timeout=5).json()


def server_layer_store(settings):
    from stabletoolbench_mirror.factory import build_store

    store = build_store(settings)
    return list(store)
