"""Limits answer overload at once with a clear JSON error instead of queueing without bound."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror import protocol
from stabletoolbench_mirror.layer import MirrorLayer
from stabletoolbench_mirror.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore

from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.responders import KeyedResponder


def payload(i: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Limit Tool", "api_name": "api", "tool_input": json.dumps({"n": i}), "strip": "", "toolbench_key": ""}


NS = "Data/limit_tool_for_Data/api"


def post_all(url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], float]]:
    def one(body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        start = time.monotonic()
        r = requests.post(url + "/virtual", json=body, timeout=30)
        return r.status_code, r.json(), time.monotonic() - start

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def test_per_client_in_flight_limit_refuses_at_once_then_frees(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_in_flight_per_client": 4})
    responder = KeyedResponder(delay_s=1.0)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))
    results = post_all(server.url, [payload(i) for i in range(10)])
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(ok) == 4 and len(refused) == 6, [r[0] for r in results]
    for _status, body, elapsed in refused:
        assert body == {"error": "too many requests in flight from this client", "response": ""}
        assert elapsed < 0.9, "a refusal must not wait for the slow requests"
    # the slots are given back: the client may send again
    assert post_all(server.url, [payload(i) for i in range(20, 24)]) and responder.calls == 8
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


def test_pending_misses_are_bounded_hits_still_served(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_pending_misses": 3, "max_in_flight_per_client": 100})
    store = DiskcacheStore(tmp_path / "s")
    store.add(Record.from_answer(NS, "{'n': -1}", {"error": "", "response": "cached"}, "imported"), None)
    server = serve(settings, MirrorLayer(store, responders=[KeyedResponder(delay_s=1.5)], max_pending_misses=3))
    with ThreadPoolExecutor(1) as side:
        misses = side.submit(post_all, server.url, [payload(i) for i in range(10)])
        time.sleep(0.5)
        start = time.monotonic()
        hit = requests.post(server.url + "/virtual", json=payload(-1), timeout=30)
        assert hit.status_code == 200 and hit.json()["response"] == "cached"
        assert time.monotonic() - start < 0.5, "a hit must not wait behind pending misses"
        results = misses.result()
    recorded = [r for r in results if r[0] == 200]
    overloaded = [r for r in results if r[0] == 503]
    assert len(recorded) == 3 and len(overloaded) == 7
    for _status, body, elapsed in overloaded:
        assert "overloaded" in body["error"] and body["response"] == ""
        assert elapsed < 1.0
    for _status, body, _elapsed in recorded:
        assert body["error"] == "" and body["response"].startswith("answer for")


def test_body_size_limit_is_configurable(serve, settings_factory) -> None:
    server = serve(settings_factory(limits={"max_body_bytes": 2048}))
    small = payload(1)
    big = dict(small, tool_input=json.dumps({"q": "x" * 3000}))
    assert requests.post(server.url + "/virtual", json=small, timeout=10).status_code == 200
    r = requests.post(server.url + "/virtual", json=big, timeout=10)
    assert r.status_code == 413 and r.json() == {"error": "request body larger than 2048 bytes", "response": ""}


def test_simulator_hung_garbage_or_failing_then_healthy(tmp_path: Path, serve, settings_factory) -> None:
    """Each fault gets a clear answer within the configured timeout and records nothing; the fix needs no restart."""
    mode = {"reply": Reply(hang=True)}
    with OpenAIStub(lambda body: mode["reply"]) as sim:
        settings = settings_factory(
            simulator={"enabled": True, "api_base": sim.api_base, "read_timeout_s": 0.5, "max_retries": 0, "connect_timeout_s": 0.5},
        )
        server = serve(settings)
        for reply, expected_error in (
            (Reply(hang=True), protocol.API_NOT_WORKING),
            (Reply(content="this is not JSON at all {"), protocol.SIMULATION_FAILED),
            (Reply(status=500), protocol.API_NOT_WORKING),
            (Reply(close=True), protocol.API_NOT_WORKING),
        ):
            mode["reply"] = reply
            start = time.monotonic()
            r = requests.post(server.url + "/virtual", json=payload(7), timeout=30)
            assert time.monotonic() - start < 5.0
            assert r.status_code == 200 and r.json()["error"] == expected_error, (reply, r.text)
            assert r.headers["x-stm-outcome"] == "failed"
        mode["reply"] = Reply(content=json.dumps({"error": "", "response": "fine now"}))
        r = requests.post(server.url + "/virtual", json=payload(7), timeout=30)
        assert r.json() == {"error": "", "response": "fine now"} and r.headers["x-stm-outcome"] == "recorded"
        r = requests.post(server.url + "/virtual", json=payload(7), timeout=30)
        assert r.headers["x-stm-outcome"] == "hit"


def test_lone_surrogates_in_requests_or_answers_never_crash(tmp_path: Path, serve, settings_factory) -> None:
    """JSON escapes like "\\ud800" decode to text no UTF-8 store can hold: clear answers, nothing stored."""
    with OpenAIStub(lambda body: Reply(content='{"error": "", "response": "broken \\ud800 text"}')) as sim:
        server = serve(settings_factory(simulator={"enabled": True, "api_base": sim.api_base, "max_retries": 0}))
        url = server.url + "/virtual"
        r = requests.post(url, data=b'{"category": "A\\udfff", "tool_name": "T", "api_name": "a", "tool_input": "{}"}', timeout=10)
        assert r.status_code == 422 and "lone UTF-16 surrogate" in r.json()["error"]
        r = requests.post(url, json=dict(payload(1), tool_input='{"q": "\\ud800"}'), timeout=10)
        assert r.status_code == 200 and r.json() == protocol.parse_error_answer()
        r = requests.post(url, json=payload(2), timeout=10)  # the simulator answers with a lone surrogate
        assert r.status_code == 200 and r.headers["x-stm-outcome"] == "failed", r.text
        r = requests.post(url, json=dict(payload(3), tool_input='{"emoji": "\\ud83d\\ude00"}'), timeout=10)  # a proper pair is fine
        assert r.status_code == 200 and r.headers["x-stm-outcome"] == "failed"  # (the stub still answers badly)
        assert sim.count == 2
