"""What a score's records hold and how they serve: a snapshot serves in replay whatever it holds (only model
calls, only tool answers, both, nothing), and ``record.served_store`` receives a copy of every answer served.

Real servers on 127.0.0.1 (the mirror, an OpenAI-compatible upstream), real stores, snapshots and the
command line's start-up checks (``doctor``, the checks ``serve`` runs before it listens).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from stabletoolbench_mirror.commands.cli import main as cli
from stabletoolbench_mirror.config import load_settings
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.responders import Attempt
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.serving.server import create_app, uvicorn_options
from stabletoolbench_mirror.startup.checks import inspect
from tests.helpers.live import UvicornThread
from tests.helpers.model_stubs import AgentStub
from tests.helpers.payloads import answer_payload
from tests.helpers.responders import KeyedResponder

MODEL = "gpt-3.5-turbo-16k-0613"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "\nwhat is the weather in Paris?\nBegin!\n"}], "temperature": 0}


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def served(config: Path) -> UvicornThread:
    settings = load_settings(config, environ={})
    return UvicornThread(create_app(settings), **uvicorn_options(settings))


def record_model_calls(tmp_path: Path, agent: AgentStub, times: int = 2) -> Path:
    """A store holding only model calls (``times`` identical requests), snapshotted; returns the snapshot."""
    config = write_config(tmp_path / "record.yml", {
        "mode": "record", "store": {"path": str(tmp_path / "store")}, "log_level": "warning",
        "llm": {"upstreams": [{"base_url": agent.api_base, "models": [MODEL]}]},
    })
    with served(config) as server:
        for _ in range(times):
            assert requests.post(server.url + "/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
    assert cli(["snapshot", str(tmp_path / "snap"), "--store", str(tmp_path / "store")]) == 0
    return tmp_path / "snap"


def replay_config(tmp_path: Path, snapshot: Path) -> Path:
    return write_config(tmp_path / "replay.yml", {
        "mode": "replay", "store": {"path": str(tmp_path / "replay-store")}, "frozen_caches": [str(snapshot)], "log_level": "warning",
    })


def test_a_snapshot_holding_only_model_calls_passes_the_start_checks_and_serves_in_replay(tmp_path: Path) -> None:
    with AgentStub() as agent:
        snapshot = record_model_calls(tmp_path, agent)
        recorded = sorted((json.loads(r["body"]) for r in _store_records(tmp_path / "store")), key=lambda c: c["id"])
    manifest = json.loads((snapshot / "manifest.json").read_text())
    assert manifest["by_source"] == {"model": 2} and not any((snapshot / c).is_dir() for c in ("Data", "Weather"))
    assert cli(["snapshot", "--verify", str(snapshot)]) == 0
    config = replay_config(tmp_path, snapshot)
    # the checks serve and doctor run: no "has no cache files" error, and the model's file is counted
    report = inspect(load_settings(config, environ={}), open_store=True, full_counts=True, probe_endpoints=False)
    assert not report.errors, [f.line() for f in report.errors]
    assert dict(report.lines)["frozen cache 0"].endswith(": 1 file, 0 tools, 0 categories, 1 model, 2 entries (2 model calls)")
    assert cli(["doctor", "--config", str(config), "--no-probe"]) == 0
    # and it serves: both occurrences, from the snapshot, with the agent stopped
    with served(config) as server:
        got = [requests.post(server.url + "/v1/chat/completions", json=CHAT, timeout=30) for _ in range(3)]
    assert [g.status_code for g in got] == [200, 200, 404]
    assert [g.json() for g in got[:2]] == recorded  # occurrence 1, then 2 (the stub numbers its answers)
    assert [c["id"] for c in recorded] == ["chatcmpl-stub-1", "chatcmpl-stub-2"]
    assert {g.headers["x-stm-source"] for g in got[:2]} == {"frozen"}


def test_a_snapshot_of_an_empty_store_is_a_frozen_cache_that_answers_nothing(tmp_path: Path) -> None:
    from stabletoolbench_mirror.stores import DiskcacheStore

    DiskcacheStore(str(tmp_path / "store")).close()
    assert cli(["snapshot", str(tmp_path / "snap"), "--store", str(tmp_path / "store")]) == 0
    config = replay_config(tmp_path, tmp_path / "snap")
    assert cli(["doctor", "--config", str(config), "--no-probe"]) == 0
    # a folder without a manifest and without cache files is still refused, naming the layout
    (tmp_path / "plain").mkdir()
    assert cli(["doctor", "--config", str(replay_config(tmp_path, tmp_path / "plain")), "--no-probe"]) == 1


def _store_records(path: Path) -> list[dict[str, Any]]:
    from stabletoolbench_mirror.stores import DiskcacheStore

    with DiskcacheStore(str(path), read_only=True) as store:
        return [json.loads(r.to_json()) for r in store]


@pytest.fixture(autouse=True)
def _no_stm_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STM_CONFIG", "STM_MODE"):
        monkeypatch.delenv(name, raising=False)


# -- record.served_store -----------------------------------------------------------------------------


class _Responder(KeyedResponder):
    """Answers every call (keyed), except the API ``broken``, which gets no usable answer (a failure record)."""

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        if call.api.endswith("/broken"):
            return Attempt(None, self.origin, "no usable answer", fallback={"error": "API not working error...", "response": ""})
        return super().respond(call, examples)


def _tree(root: Path, api: str, entries: dict[str, Any]) -> Path:
    path = root / f"{api}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries), encoding="utf-8")
    return root


def _payload(api: str, value: str) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "demo", "api_name": api, "tool_input": json.dumps({"q": value}), "strip": "", "toolbench_key": ""}


def test_the_served_store_holds_every_answer_served_and_replays_the_run_alone(tmp_path: Path) -> None:
    frozen = _tree(tmp_path / "frozen", "Data/demo_for_Data/from_frozen", {"{'q': 'f'}": {"error": "", "response": "frozen answer"}})
    _tree(tmp_path / "old", "Data/demo_for_Data/from_store", {"{'q': 's'}": {"error": "", "response": "the store's answer"}})
    assert cli(["cache", "import", str(tmp_path / "old"), "--store-path", str(tmp_path / "store"), "-q"]) == 0
    settings = load_settings(write_config(tmp_path / "record.yml", {
        "mode": "record", "store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(frozen)], "log_level": "warning",
        "record": {"served_store": str(tmp_path / "served")},
    }), environ={})
    calls = [_payload("from_frozen", "f"), _payload("from_store", "s"), _payload("new", "n"), _payload("broken", "b"),
             _payload("from_frozen", "f")]
    with UvicornThread(create_app(settings, build_layer(settings, responders=[_Responder()]))) as server:
        answers = [server.post(p) for p in calls]
    assert [a.headers["x-stm-outcome"] for a in answers] == ["hit", "hit", "recorded", "failed", "hit"]
    held = {r["api"].rsplit("/", 1)[1]: r for r in _store_records(tmp_path / "served")}
    assert sorted(held) == ["broken", "from_frozen", "from_store", "new"]
    assert held["from_frozen"]["source"] == "frozen" and held["from_store"]["source"] == "imported"
    assert held["broken"]["outcome"] == "failure" and held["new"]["source"] == "simulated"
    # the configured store holds only what this server recorded, and the store it imported
    assert sorted(r["api"].rsplit("/", 1)[1] for r in _store_records(tmp_path / "store")) == ["broken", "from_store", "new"]

    # the served store alone replays the run: a fresh store, its snapshot the only frozen cache, nothing to fill a miss
    assert cli(["snapshot", str(tmp_path / "records"), "--store", str(tmp_path / "served")]) == 0
    config = replay_config(tmp_path, tmp_path / "records")
    assert cli(["doctor", "--config", str(config), "--no-probe"]) == 0
    with served(config) as server:
        again = [server.post(p) for p in calls]
    assert [a.content for a in again] == [a.content for a in answers]
    assert [a.headers["x-stm-outcome"] for a in again] == ["hit", "hit", "hit", "hit", "hit"]


def test_without_a_served_store_nothing_is_copied(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path / "c.yml", {"store": {"path": str(tmp_path / "store")}, "log_level": "warning"}),
                             environ={})
    layer = build_layer(settings, responders=[_Responder()])
    try:
        assert layer.served is None
        assert answer_payload(layer, _payload("new", "n")).kind.value == "recorded"
    finally:
        layer.close()
    assert not (tmp_path / "served").exists()


# -- a run's own model answers (llm.reuse_answers: false) and records that replay ------------------------


def _run_server(tmp_path: Path, agent: AgentStub, served_store: str, **llm: Any) -> UvicornThread:
    return served(write_config(tmp_path / f"{served_store}.yml", {
        "mode": "record", "store": {"path": str(tmp_path / "store")}, "log_level": "warning",
        "record": {"served_store": str(tmp_path / served_store)},
        "llm": {"upstreams": [{"base_url": agent.api_base, "models": [MODEL]}], **llm},
    }))


def _ids(server: UvicornThread, times: int, run: str) -> list[str]:
    url = f"{server.url}/run/{run}/v1/chat/completions"
    return [requests.post(url, json=CHAT, timeout=30).json()["id"] for _ in range(times)]


def test_a_run_of_its_own_draws_fresh_answers_and_a_resumed_one_gets_its_own_again(tmp_path: Path) -> None:
    with AgentStub() as agent:
        with _run_server(tmp_path, agent, "served1", reuse_answers=False) as server:
            first = _ids(server, 2, run="judge-1")
        # a second run on the same store: asked upstream again (the stub numbers its answers), the store's records replaced
        with _run_server(tmp_path, agent, "served2", reuse_answers=False) as server:
            second = _ids(server, 2, run="judge-2")
        assert first == ["chatcmpl-stub-1", "chatcmpl-stub-2"] and second == ["chatcmpl-stub-3", "chatcmpl-stub-4"]
        assert sorted(json.loads(r["body"])["id"] for r in _store_records(tmp_path / "store")) == second
        # the second run again, resumed (its served store kept), in a new model-call run: its own answers, nothing asked
        with _run_server(tmp_path, agent, "served2", reuse_answers=False) as server:
            assert _ids(server, 2, run="judge-2-attempt-2") == second
        # reusing what is recorded (the default): the store's answers, nothing asked
        with _run_server(tmp_path, agent, "served3") as server:
            assert _ids(server, 2, run="judge-3") == second
        assert agent.count == 4
    # without a served store the setting cannot work: the start-up checks say so, naming the key
    config = write_config(tmp_path / "bad.yml", {"store": {"path": str(tmp_path / "store")}, "llm": {
        "reuse_answers": False, "upstreams": [{"base_url": "http://127.0.0.1:9/v1"}]}})
    report = inspect(load_settings(config, environ={}), probe_endpoints=False)
    assert [f.key for f in report.errors] == ["llm.reuse_answers"]
    assert "record.served_store" in report.errors[0].message


def test_records_whose_occurrences_do_not_start_at_one_are_never_sealed(tmp_path: Path) -> None:
    """Two runs of one name on one store (what score's record runs of one label did): the second one's records are
    occurrences #3-#4, which no replay reaches; sealing them is refused, naming the request."""
    from stabletoolbench_mirror.scoring.bundle import BundleError, seal

    with AgentStub() as agent:
        for served_store in ("served1", "served2"):
            with _run_server(tmp_path, agent, served_store) as server:
                _ids(server, 2, run="same-name")
    for served_store in ("served1", "served2"):
        bundle = tmp_path / f"{served_store}-bundle"
        assert cli(["snapshot", str(bundle / "records"), "--store", str(tmp_path / served_store), "-q"]) == 0
        (bundle / "run.json").write_text(json.dumps({"label": "run", "groups": ["G1_instruction"]}), encoding="utf-8")
    assert seal(tmp_path / "served1-bundle")["content_hash"].startswith("sha256:")
    with pytest.raises(BundleError) as refused:
        seal(tmp_path / "served2-bundle")
    message = str(refused.value)
    assert f"records/@model/{MODEL}/chat_completions.json: request sha256:" in message
    assert "is recorded as #3, #4, without #1, #2" in message and "not sealed: its records would not replay" in message
    assert not (tmp_path / "served2-bundle" / "bundle.json").exists()
