"""Limits make requests over them wait (StableToolBench counts any non-200 as a tool error); only a full
queue, a wait past its timeout or a stalled client is refused, each with a JSON error naming the setting."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.serving import admission, uvicorn_protocol
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


def test_requests_over_the_per_client_limit_wait_for_a_slot(tmp_path: Path, serve, settings_factory) -> None:
    """StableToolBench's client turns any non-200 into a tool error: over the limit means waiting, not 429."""
    settings = settings_factory(limits={"max_in_flight_per_client": 4})
    responder = KeyedResponder(delay_s=0.5)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))
    results = post_all(server.url, [payload(i) for i in range(10)])
    assert [r[0] for r in results] == [200] * 10
    for i, (_status, body, _elapsed) in enumerate(results):
        assert body == {"error": "", "response": f"answer for {NS} {{'n': {i}}}"}
    assert responder.calls == 10 and responder.max_active == 4, "never more than the limit at once"
    assert max(r[2] for r in results) >= 1.0, "the ones over the limit waited for a slot"
    stats = requests.get(server.url + "/stats", timeout=5).json()
    assert stats["refused"] == 0 and stats["recorded"] == 10


def _post_from(source_ip: str, url: str, body: dict[str, Any]) -> tuple[int, float]:
    """One POST from a chosen loopback address (another client, as the server sees it)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30, source_address=(source_ip, 0)) as sock:
        sock.sendall(f"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        status = int(sock.recv(65536).split()[1])
    return status, time.monotonic() - start


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.005)


def test_waiting_is_per_client_another_client_is_not_queued_behind(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_in_flight_per_client": 2})
    responder = KeyedResponder(delay_s=0.6)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))
    with ThreadPoolExecutor(1) as side:
        busy = side.submit(post_all, server.url, [payload(i) for i in range(10)])  # 127.0.0.1: 5 rounds of 0.6 s
        _until(lambda: responder.active == 2, "the busy client fills its 2 slots")
        status, elapsed = _post_from("127.0.0.2", server.url, payload(100))
        assert status == 200
        assert elapsed < 1.5, f"another client waited {elapsed:.2f} s behind the busy one"
        assert [r[0] for r in busy.result()] == [200] * 10


@pytest.mark.parametrize("trusted", [[], ["127.0.0.1"], ["10.0.0.0/8"]])
def test_a_client_cannot_pose_as_others_unless_it_is_a_trusted_proxy(tmp_path: Path, serve, settings_factory, trusted: list[str]) -> None:
    # four requests from 127.0.0.1, each claiming another client in X-Forwarded-For
    settings = settings_factory(limits={"max_in_flight_per_client": 1, "trusted_proxies": trusted})
    responder = KeyedResponder(delay_s=0.3)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))

    def one(i: int) -> int:
        headers = {"X-Forwarded-For": f"203.0.113.{i}"}
        return requests.post(server.url + "/virtual", json=payload(i), headers=headers, timeout=30).status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == [200] * 4
    # believed only from a named proxy: then four clients at once; else one client, one at a time
    assert responder.max_active == (4 if trusted == ["127.0.0.1"] else 1)


def _slow_misses_from(source_ip: str, url: str, forwarded: list[str], first: int) -> int:
    """One slow miss per ``X-Forwarded-For`` value, all at once from ``source_ip``; the statuses must all be 200."""
    host, port = url.removeprefix("http://").split(":")

    def one(i: int) -> int:
        data = json.dumps(payload(first + i)).encode()
        with socket.create_connection((host, int(port)), timeout=60, source_address=(source_ip, 0)) as sock:
            sock.sendall(f"POST /virtual HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {forwarded[i]}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        return int(reply.split()[1])

    with ThreadPoolExecutor(len(forwarded)) as pool:
        return sum(status == 200 for status in pool.map(one, range(len(forwarded))))


def test_behind_the_readmes_proxy_a_rotating_or_malformed_forwarded_for_gets_no_more_than_the_limit(
    tmp_path: Path, serve, settings_factory
) -> None:
    # the README's example: the proxy on its own loopback address (nginx: proxy_bind 127.0.0.2), named alone
    settings = settings_factory(limits={"max_in_flight_per_client": 2, "trusted_proxies": ["127.0.0.2"]})
    responder = KeyedResponder(delay_s=0.2)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))
    # a local client with a new X-Forwarded-For per request: it is no proxy, so it is one client
    assert _slow_misses_from("127.0.0.1", server.url, [f"198.51.100.{i}" for i in range(30)], 1000) == 30
    assert responder.max_active == 2
    # through the proxy, malformed values (each different) name nobody: they are the proxy, one client
    responder.max_active = 0
    kinds = ["client-{i}", "198.51.100.{i}:port", "unknown-{i}", "[::{i}", "1.2.3.{i}, junk{i}", "_hidden{i}", "1{i}" + "0" * 70]
    junk = [kinds[i % len(kinds)].format(i=i) for i in range(30)]
    assert _slow_misses_from("127.0.0.2", server.url, junk, 2000) == 30
    assert responder.max_active == 2
    # and what a client puts left of the proxy's own entry is never read: the rightmost untrusted address is the client
    responder.max_active = 0
    assert _slow_misses_from("127.0.0.2", server.url, [f"203.0.113.{i}, 198.51.100.7" for i in range(12)], 3000) == 12
    assert responder.max_active == 2


def test_behind_a_chain_of_trusted_proxies_each_client_gets_its_own_limit(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_in_flight_per_client": 1, "trusted_proxies": ["127.0.0.2", "10.0.0.0/8"]})
    responder = KeyedResponder(delay_s=0.3)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))
    # each value: forged leftmost, the client, then an inner proxy (10.x) and a port the outer one added
    forwarded = [f"6.6.6.6, 198.51.100.{i}:5000, 10.1.2.3" for i in range(4)]
    assert _slow_misses_from("127.0.0.2", server.url, forwarded, 1000) == 4
    assert responder.max_active == 4


def test_a_trusted_proxy_that_is_no_address_is_a_config_error(settings_factory) -> None:
    with pytest.raises(ConfigError, match=r"limits.trusted_proxies.*'localhost' is not an IP address or network"):
        settings_factory(limits={"trusted_proxies": ["localhost"]})


def test_a_full_wait_queue_is_refused_at_once_naming_the_bound(tmp_path: Path, serve, settings_factory, monkeypatch) -> None:
    monkeypatch.setattr(admission, "MAX_QUEUED_REQUESTS", 2)
    settings = settings_factory(limits={"max_in_flight_per_client": 1})
    responder = KeyedResponder(delay_s=1.0)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder]))
    results = post_all(server.url, [payload(i) for i in range(6)])
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    assert len(ok) == 3 and len(refused) == 3, [r[0] for r in results]  # one answered, two waited
    for _status, body, elapsed in refused:
        assert body == {"error": "stabletoolbench-mirror is overloaded (2 requests are already waiting, the most this server queues)",
                        "response": ""}
        assert elapsed < 0.9, "a full queue refuses at once"
    stats = requests.get(server.url + "/stats", timeout=5).json()
    assert stats["refused"] == 3 and stats["refusals"] == {"max_queued_requests": 3}
    assert stats["requests"] == 6
    # the slots are given back: the client may send again
    assert [r[0] for r in post_all(server.url, [payload(i) for i in range(20, 22)])] == [200, 200]


def test_a_wait_past_the_queue_timeout_is_refused_naming_the_setting(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_in_flight_per_client": 1, "queue_timeout_s": 0.5})
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[KeyedResponder(delay_s=2.0)]))
    results = sorted(post_all(server.url, [payload(1), payload(2)]), key=lambda r: r[2])
    status, body, elapsed = results[0]
    assert status == 503 and "limits.queue_timeout_s" in body["error"]
    assert 0.4 < elapsed < 1.5
    assert results[1][0] == 200


def test_pending_misses_are_bounded_they_wait_and_hits_are_still_served(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_pending_misses": 3, "max_in_flight_per_client": 100})
    store = DiskcacheStore(tmp_path / "s")
    store.add(Record.from_answer(NS, "{'n': -1}", {"error": "", "response": "cached"}, "imported"), None)
    responder = KeyedResponder(delay_s=0.5)
    server = serve(settings, MirrorLayer(store, responders=[responder], max_pending_misses=3))
    with ThreadPoolExecutor(1) as side:
        misses = side.submit(post_all, server.url, [payload(i) for i in range(10)])
        _until(lambda: responder.active == 3, "the misses fill their 3 turns")
        start = time.monotonic()
        hit = requests.post(server.url + "/virtual", json=payload(-1), timeout=30)
        assert hit.status_code == 200 and hit.json()["response"] == "cached"
        assert time.monotonic() - start < 0.4, "a hit must not wait behind pending misses"
        results = misses.result()
    assert [r[0] for r in results] == [200] * 10
    assert responder.max_active == 3 and responder.calls == 10
    for i, (_status, body, _elapsed) in enumerate(results):
        assert body == {"error": "", "response": f"answer for {NS} {{'n': {i}}}"}


def test_a_miss_waiting_past_the_queue_timeout_is_refused(tmp_path: Path, serve, settings_factory) -> None:
    settings = settings_factory(limits={"max_pending_misses": 1, "max_in_flight_per_client": 100, "queue_timeout_s": 0.5})
    layer = build_layer(settings, store=DiskcacheStore(tmp_path / "s"), responders=[KeyedResponder(delay_s=2.0)])
    server = serve(settings, layer)
    results = sorted(post_all(server.url, [payload(1), payload(2)]), key=lambda r: r[2])
    status, body, elapsed = results[0]
    assert status == 503 and "limits.max_pending_misses" in body["error"], body
    assert 0.4 < elapsed < 1.5
    assert results[1][0] == 200


def _stalled_connections(url: str, body: int, headers: int = 0, silent: int = 0) -> list[socket.socket]:
    """Half-sent requests: a body promised and one byte sent, partial headers, or nothing at all."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for sent in [b"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"] * body + [
        b"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Le"
    ] * headers + [b""] * silent:
        sock = socket.create_connection((host, int(port)), timeout=30)
        if sent:
            sock.sendall(sent)
        socks.append(sock)
    return socks


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass  # an HTTP 408 answer may come first
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_stalled_clients_cannot_lock_an_address_out(tmp_path: Path, serve, settings_factory, monkeypatch) -> None:
    """64 half-sent bodies from 127.0.0.1 (the default per-client limit), plus stalled headers and silent
    connections: a normal request still gets through, and the server closes them all."""
    timeout = 2.0
    monkeypatch.setattr(uvicorn_protocol, "HEADER_TIMEOUT_S", timeout)
    settings = settings_factory(limits={"body_timeout_s": timeout})
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[KeyedResponder()]))
    socks = _stalled_connections(server.url, body=64, headers=8, silent=8)
    try:
        time.sleep(0.2)
        start = time.monotonic()
        r = requests.post(server.url + "/virtual", json=payload(1), timeout=30)
        assert r.status_code == 200 and r.json()["response"] == f"answer for {NS} {{'n': 1}}"
        # stalled bodies hold no slot at all (the body is read before a slot is taken): no wait for the timeout
        assert time.monotonic() - start < timeout / 2
        # and every stalled connection is closed by the server once its timeout has passed
        deadline = time.monotonic() + timeout + 2.0
        for sock in socks:
            assert _closed_by_server(sock, max(0.05, deadline - time.monotonic())), "a stalled connection was left open"
    finally:
        for sock in socks:
            sock.close()
    stats = requests.get(server.url + "/stats", timeout=5).json()
    assert stats["refusals"] == {"limits.body_timeout_s": 64}  # the ones that had sent their headers


def test_a_stalled_body_gets_408_naming_the_setting(serve, settings_factory) -> None:
    server = serve(settings_factory(limits={"body_timeout_s": 0.5}))
    (sock,) = _stalled_connections(server.url, body=1)
    with sock:
        sock.settimeout(5)
        answer = sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert json.loads(body) == {"error": "the request body did not arrive within 0.5 s (limits.body_timeout_s)", "response": ""}


def test_body_size_limit_is_configurable(serve, settings_factory) -> None:
    server = serve(settings_factory(limits={"max_body_bytes": 2048}))
    small = payload(1)
    big = dict(small, tool_input=json.dumps({"q": "x" * 3000}))
    assert requests.post(server.url + "/virtual", json=small, timeout=10).status_code == 200
    r = requests.post(server.url + "/virtual", json=big, timeout=10)
    assert r.status_code == 413 and r.json() == {"error": "request body larger than 2048 bytes", "response": ""}


def test_simulator_hung_garbage_or_failing_then_healthy(tmp_path: Path, serve, settings_factory) -> None:
    """Each fault gets a clear answer within the configured timeout, recorded only as a failure record; the fix
    needs no restart (the failure records are tried again and replaced)."""
    mode = {"reply": Reply(hang=True)}
    with OpenAIStub(lambda body: mode["reply"]) as sim:
        settings = settings_factory(
            simulator={"enabled": True, "api_base": sim.api_base, "read_timeout_s": 0.5, "max_retries": 0, "connect_timeout_s": 0.5},
        )
        server = serve(settings)
        faults = (
            (Reply(hang=True), protocol.API_NOT_WORKING),
            (Reply(content="this is not JSON at all {"), protocol.SIMULATION_FAILED),
            (Reply(status=500), protocol.API_NOT_WORKING),
            (Reply(close=True), protocol.API_NOT_WORKING),
        )
        for n, (reply, expected_error) in enumerate(faults):
            mode["reply"] = reply
            start = time.monotonic()
            r = requests.post(server.url + "/virtual", json=payload(7 + n), timeout=30)
            assert time.monotonic() - start < 5.0
            assert r.status_code == 200 and r.json()["error"] == expected_error, (reply, r.text)
            assert r.headers["x-stm-outcome"] == "failed" and r.headers["x-stm-failure"] == "true"
        mode["reply"] = Reply(content=json.dumps({"error": "", "response": "fine now"}))
        for n in range(len(faults)):
            r = requests.post(server.url + "/virtual", json=payload(7 + n), timeout=30)
            assert r.json() == {"error": "", "response": "fine now"} and r.headers["x-stm-outcome"] == "replaced"
            r = requests.post(server.url + "/virtual", json=payload(7 + n), timeout=30)
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
