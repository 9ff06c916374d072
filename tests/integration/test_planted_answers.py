"""A client cannot plant an answer under another call's key (issue 18, item 1).

Upstream keys a call by ``str()`` of its parsed input, which forgets the input's kind: the
string input ``"\\"{'city': 'Rome'}\\""`` has the key of the object ``{"city": "Rome"}``.  In the
writable store a string that reads like another kind's key is kind-marked, so each call gets
its own record; frozen upstream trees are still looked up exactly as upstream does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.core import keys
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_sessions
from stabletoolbench_mirror.snapshots.tree_export import export_tree
from stabletoolbench_mirror.snapshots.tree_import import import_tree
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache
from tests.helpers.redis_server import redis_prefix, redis_server  # noqa: F401
from tests.helpers.responders import KeyedResponder
from tests.helpers.store_fixtures import spec, store  # noqa: F401

API = "Data/key_tool_for_Data/api"


def body(tool_input: str) -> dict[str, str]:
    return {"category": "Data", "tool_name": "Key Tool", "api_name": "api", "tool_input": tool_input, "strip": "", "toolbench_key": ""}


def post(server: Any, tool_input: str, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(server.url + "/virtual", json=body(tool_input), headers=headers or {}, timeout=30)


#: (the input of an agent's call, a string input whose text is that call's upstream key)
PAIRS = [
    ('{"city": "Rome"}', json.dumps("{'city': 'Rome'}")),
    ("[1, 2]", json.dumps("[1, 2]")),
    ("5", json.dumps("5")),
    ("1.5", json.dumps("1.5")),
    ("null", json.dumps("None")),
    ("true", json.dumps("True")),
    ('{"a": NaN}', json.dumps("{'a': nan}")),
    ("Infinity", json.dumps("inf")),
]


@pytest.mark.parametrize("planted_first", [True, False], ids=["string-first", "object-first"])
@pytest.mark.parametrize("agent, planter", PAIRS, ids=[p[0] for p in PAIRS])
def test_a_string_input_never_answers_another_kind_of_input(store, serve, settings_factory, agent, planter, planted_first) -> None:  # noqa: F811
    responder = KeyedResponder()
    server = serve(settings_factory(), MirrorLayer(store, responders=[responder]))
    assert str(json.loads(planter)) == str(json.loads(agent))  # the attack: one upstream key for both
    order = [planter, agent] if planted_first else [agent, planter]
    answers = {}
    for tool_input in order:
        r = post(server, tool_input)
        assert r.status_code == 200 and r.headers["x-stm-outcome"] == "recorded", (tool_input, r.headers)
        answers[tool_input] = r.json()
    assert answers[planter] != answers[agent] and responder.calls == 2
    # each replays its own answer
    for tool_input in order:
        r = post(server, tool_input)
        assert r.headers["x-stm-outcome"] == "hit" and r.json() == answers[tool_input]
    # an object input keeps upstream's key exactly; the string's record key is marked
    stored = {record.key for record in store}
    assert str(json.loads(agent)) in stored and str(json.loads(planter)) + keys.STRING_MARK in stored


def test_a_plain_input_cannot_reach_a_session_key(store, serve, settings_factory) -> None:  # noqa: F811
    responder = KeyedResponder()
    settings = settings_factory()
    server = serve(settings, MirrorLayer(store, responders=[responder], sessions=build_sessions(settings, store)))
    task = "Find the weather in Rome"  # often the public query text: the history hash is computable
    session_key = keys.session_key("{'city': 'Rome'}", keys.history_start(task))
    planted = post(server, json.dumps(session_key))
    assert planted.headers["x-stm-outcome"] == "recorded"
    sid = requests.post(server.url + "/sessions", json={"task": task}, timeout=10).json()["id"]
    r = post(server, '{"city": "Rome"}', {"X-STM-Session": sid})
    assert r.status_code == 200 and r.headers["x-stm-outcome"] == "recorded" and r.json() != planted.json()
    assert responder.calls == 2
    assert {record.key for record in store} == {session_key + keys.STRING_MARK, session_key}


def test_strings_that_spell_no_other_kind_keep_upstreams_key() -> None:
    for text in ("Paris", "hello world", "", "12 apples", "x}", "none", "true"):
        assert keys.record_key(text) == text
    for value in ({"a": 1}, [1], 5, 1.5, None, True):
        assert keys.record_key(value) == str(value)
    for text in ("{'a': 1}", "{x", "[1]", "5", "-1e+100", "nan", "None", "False", "x #input=str", "y" + keys.SESSION_KEY_MARK + "0" * 32):
        marked = keys.record_key(text)
        assert marked == text + keys.STRING_MARK
        # a marked key reads back as its string (cache import, snapshots as frozen trees, fidelity)
        assert keys.value_from_upstream_key(marked) == text
        assert keys.canonical_from_upstream_key(marked) == keys.canonical_key(text)


def test_frozen_upstream_trees_are_looked_up_as_upstream_does(tmp_path: Path, serve, settings_factory) -> None:
    tree = tmp_path / "tree"
    (tree / "Data" / "key_tool_for_Data").mkdir(parents=True)
    upstream = {"error": "", "response": "upstream's answer"}
    (tree / "Data" / "key_tool_for_Data" / "api.json").write_text(json.dumps({"{'city': 'Rome'}": upstream}))
    layer = MirrorLayer(DiskcacheStore(tmp_path / "store"), frozen=[FrozenCache(str(tree))], responders=[KeyedResponder()])
    server = serve(settings_factory(), layer)
    for tool_input in ('{"city": "Rome"}', json.dumps("{'city': 'Rome'}")):
        r = post(server, tool_input)
        assert r.headers["x-stm-outcome"] == "hit" and r.json() == upstream, tool_input


def test_a_marked_record_round_trips_through_an_export_and_an_import(tmp_path: Path, serve, settings_factory) -> None:
    store = DiskcacheStore(tmp_path / "store")
    server = serve(settings_factory(), MirrorLayer(store, responders=[KeyedResponder()]))
    answers = {t: post(server, t).json() for t in ('{"city": "Rome"}', json.dumps("{'city': 'Rome'}"))}
    export_tree(store, str(tmp_path / "tree"), progress=False)
    # the exported tree served as a frozen cache, and imported into a fresh store: each call its own answer
    frozen = MirrorLayer(DiskcacheStore(tmp_path / "empty"), frozen=[FrozenCache(str(tmp_path / "tree"))])
    imported_store = DiskcacheStore(tmp_path / "imported")
    import_tree(imported_store, str(tmp_path / "tree"), progress=False)
    for layer in (frozen, MirrorLayer(imported_store)):
        replay = serve(settings_factory(), layer)
        for tool_input, answer in answers.items():
            r = post(replay, tool_input)
            assert r.headers["x-stm-outcome"] == "hit" and r.json() == answer, tool_input


def test_a_record_a_string_input_made_before_the_change_still_answers_it(tmp_path: Path, serve, settings_factory) -> None:
    # written as the old code wrote it: the string's upstream key, its canonical pointer the JSON string
    store = DiskcacheStore(tmp_path / "store")
    text = "{'city': 'Rome'}"
    old = {"error": "", "response": "the string call's answer"}
    store.add(Record.from_answer(API, text, old, "simulated", "old"), keys.canonical_key(text))
    server = serve(settings_factory(), MirrorLayer(store, responders=[KeyedResponder()]))
    r = post(server, json.dumps(text))
    assert r.headers["x-stm-outcome"] == "hit" and r.json() == old
    # and the object call it collides with still gets it: `doctor --keys` lists such records
    assert post(server, '{"city": "Rome"}').json() == old
    assert post(server, '{"town": "Oslo"}').headers["x-stm-outcome"] == "recorded"  # an object call's own record
    assert post(server, json.dumps("Oslo")).headers["x-stm-outcome"] == "recorded"  # a string that spells no other kind
    server.__exit__(None, None, None)
    store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    done = subprocess.run(
        [sys.executable, "-m", "stabletoolbench_mirror", "doctor", "--keys", "--store-path", str(tmp_path / "store")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    listed = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == [f"  {API}  {text}  (simulated, old)"], done.stdout
    assert "1 record(s) of a string input share their key" in done.stdout


def test_secret_fields_in_tool_input_are_taken_out_before_keying(tmp_path: Path, serve, settings_factory) -> None:
    store = DiskcacheStore(tmp_path / "store")
    server = serve(settings_factory(), MirrorLayer(store, responders=[KeyedResponder()]))
    secret = "tbk-0123456789-secret"
    with_key = post(server, json.dumps({"q": "x", "toolbench_key": secret, "deep": [{"RapidAPI_Key": secret, "n": 1}]}))
    assert with_key.headers["x-stm-outcome"] == "recorded"
    # the same call without the secrets is the same record
    r = post(server, json.dumps({"q": "x", "deep": [{"n": 1}]}))
    assert r.headers["x-stm-outcome"] == "hit" and r.json() == with_key.json()
    assert secret not in with_key.text
    files = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert secret.encode() not in files
    # api_key is a real parameter of some RapidAPI tools: it stays
    assert ToolCall.of("Data", "Key Tool", "api", {"api_key": "abcd"}).key == "{'api_key': 'abcd'}"
