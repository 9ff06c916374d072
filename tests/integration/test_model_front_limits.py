"""``/v1`` holds what ``/virtual`` guarantees (hardening VI): a token budget reserved before each upstream call, the
front's admission and body limits, large bodies parsed off the event loop, store waits bounded and never on the
loop, only well-formed answers recorded, secrets in any part of an upstream URL masked, bounded tables and
counters.  Real servers and upstreams on 127.0.0.1, real processes where memory or locks are measured; every
bound is compared with a quantity measured in the same run, with room for a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import requests

from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.model_requests import MAX_BODY_VALUES
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.crowd import close_all, rss_mb, stalled_bodies
from tests.helpers.live import ScriptedApp, free_port, read_body, send_json
from tests.helpers.openai_stub import OpenAIStub, Reply
from tests.helpers.processes import ServeProcess
from tests.integration.test_memory_bounds import peak_mb
from tests.integration.test_model_calls import Served

MIB = 1024 * 1024


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], **extra}


def settings(tmp_path: Path, mode: str, api_base: str | None = None, **llm: Any) -> Settings:
    upstreams = [{"base_url": api_base}] if api_base else []
    return Settings(mode=mode, store={"path": str(tmp_path / "store")}, log_level="warning", llm={"upstreams": upstreams, **llm})


# -- 1. the token budget is reserved, not checked -------------------------------------------------------


def test_concurrent_calls_against_a_budget_spend_at_most_the_budget(tmp_path: Path) -> None:
    """``max_upstream_tokens: 100``, an upstream answering 100 tokens in 2 s, 30 calls at once: one goes upstream."""
    with OpenAIStub(lambda body: Reply(content="ok", delay_s=2.0, prompt_tokens=60, completion_tokens=40)) as up:
        with Served(settings(tmp_path, "record", up.api_base, max_upstream_tokens=100)) as server:
            with ThreadPoolExecutor(30) as pool:
                got = list(pool.map(lambda i: requests.post(server.url + "/v1/chat/completions", json=chat(f"q{i}"), timeout=60),
                                    range(30)))
            stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]["gpt-4o-mini"]
    statuses = sorted(r.status_code for r in got)
    assert up.count == 1 and statuses == [200] + [429] * 29, (up.count, statuses)
    refused = next(r for r in got if r.status_code == 429)
    assert refused.json()["error"]["code"] == "insufficient_quota" and "llm.max_upstream_tokens" in refused.json()["error"]["message"]
    assert refused.headers["x-should-retry"] == "false"
    assert stats["prompt_tokens"] + stats["completion_tokens"] == 100 and stats["upstream_calls"] == 1


def test_a_budget_lets_calls_through_while_their_estimates_fit_and_settles_with_what_they_used(tmp_path: Path) -> None:
    """1,000 tokens, calls asking ``max_tokens: 80`` (about 100 reserved each) that use 100: at most 10 go upstream,
    several at once, and the tokens spent never pass the budget by more than one call's."""
    arrived: list[float] = []

    def slow(body: dict[str, Any]) -> Reply:
        arrived.append(time.monotonic())
        return Reply(content="ok", delay_s=1.0, prompt_tokens=60, completion_tokens=40)

    with OpenAIStub(slow) as up, Served(settings(tmp_path, "record", up.api_base, max_upstream_tokens=1000)) as server:
        with ThreadPoolExecutor(30) as pool:
            got = list(pool.map(lambda i: requests.post(server.url + "/v1/chat/completions", json=chat(f"q{i}", max_tokens=80),
                                                        timeout=60), range(30)))
        stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]["gpt-4o-mini"]
    spent = stats["prompt_tokens"] + stats["completion_tokens"]
    assert sum(r.status_code == 200 for r in got) == up.count <= 10 and spent <= 1000 + 100
    # reserved, not serialised: calls whose estimates fit went together (two arrived while another took its second)
    assert any(later - first < 0.9 for first, later in zip(arrived, arrived[1:], strict=False)), arrived
    assert sum(r.status_code == 429 for r in got) == 30 - up.count


# -- 2. /v1 is inside admission ------------------------------------------------------------------------


def _big_chat(size: int, n: int) -> bytes:
    return json.dumps(chat(f"{n} " + "x" * size)).encode()


def test_many_large_bodies_while_the_upstream_is_slow_stay_within_the_clients_limits(tmp_path: Path) -> None:
    """12 clients each posting a 15.6 MiB body while the upstream takes 3 s, with ``max_in_flight_per_client: 2`` and
    ``max_queued_bytes: 64 MiB``: the server's peak memory grows by a bounded amount (it grew by 1,979 MB before)."""
    with OpenAIStub(lambda body: Reply(content="ok", delay_s=3.0)) as up:
        config = {"mode": "record", "store": {"path": str(tmp_path / "store")}, "llm": {"upstreams": [{"base_url": up.api_base}]},
                  "limits": {"max_in_flight_per_client": 2, "max_queued_bytes": 64 * MIB, "body_timeout_s": 60}}
        with ServeProcess(tmp_path, config) as server:
            requests.post(server.url + "/v1/chat/completions", json=chat("warm"), timeout=30)
            time.sleep(0.5)
            Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # the high-water mark starts here
            start = rss_mb(server.pid)
            bodies = [_big_chat(int(15.6 * MIB), n) for n in range(12)]
            with ThreadPoolExecutor(12) as pool:
                got = list(pool.map(lambda body: requests.post(server.url + "/v1/chat/completions", data=body, timeout=120,
                                                               headers={"content-type": "application/json"}), bodies))
            peak = peak_mb(server.pid)
            stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]
    statuses = [r.status_code for r in got]
    # some were answered (two at a time), the rest refused before their bodies were read: OpenAI-shaped 503s
    assert 200 in statuses and set(statuses) <= {200, 503}, statuses
    refused = next((r for r in got if r.status_code == 503), None)
    if refused is not None:
        assert "limits.max_queued_bytes" in refused.json()["error"]["message"] and refused.headers["retry-after"] == "5"
        assert stats["(none)"]["refused"] == statuses.count(503)
    print(f"12 bodies of 15.6 MiB: {start:.0f} -> {peak:.0f} MB; {statuses}")
    # two in flight (each body held as bytes, parsed, keyed and sent: about 5 copies) and 64 MiB of waiting bodies
    assert peak - start <= 2 * 5 * 15.6 + 64 + 150, f"12 bodies of 15.6 MiB took the server from {start:.0f} MB to {peak:.0f} MB"


def test_stalled_large_bodies_on_v1_count_against_max_queued_bytes(tmp_path: Path) -> None:
    """100 connections stalling mid-body on ``/v1``: bounded by ``max_queued_bytes`` as on ``/virtual``."""
    config = {"mode": "replay", "store": {"path": str(tmp_path / "store")},
              "limits": {"max_queued_bytes": 64 * MIB, "body_timeout_s": 60}}
    with ServeProcess(tmp_path, config) as server:
        requests.post(server.url + "/v1/chat/completions", json=chat("warm"), timeout=10)
        time.sleep(0.5)
        start = rss_mb(server.pid)
        socks = stalled_bodies(server.port, 100, body_bytes=4 * MIB, path="/v1/chat/completions")
        try:
            time.sleep(1.0)
            peak = rss_mb(server.pid)
            stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]
        finally:
            close_all(socks)
    print(f"100 stalled 4 MiB bodies: {start:.0f} -> {peak:.0f} MB")
    assert peak - start <= 64 + 100, f"100 stalled 4 MiB bodies took the server from {start:.0f} MB to {peak:.0f} MB"
    assert stats["(none)"]["refused"] >= 80, stats  # 64 MiB hold about 15 of them: the others were refused at their headers


# -- 3. large bodies are parsed and hashed off the event loop --------------------------------------------


def _latencies(url: str, body: dict[str, Any], seconds: float) -> list[float]:
    out = []
    session = requests.Session()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        got = session.post(url, json=body, timeout=30)
        out.append(time.perf_counter() - started)
        assert got.status_code == 200 and got.headers["x-stm-outcome"] == "hit", got.text[:200]
    return out


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def _many_messages(count: int) -> bytes:
    return json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "m"}] * count}).encode()


def test_a_body_of_too_many_values_is_refused_before_its_parse_and_one_at_the_bound_is_answered(tmp_path: Path) -> None:
    """480,000 messages in 15.6 MiB (180 ms of ``json.loads``, one C call holding the GIL, in a worker thread too) get
    HTTP 413 naming the bound, nothing asked upstream and no occurrence used; the most messages the bound lets through are
    recorded, and a long string (one value) is not counted against it."""
    # each message: its '{', the ',' inside it and the ',' after it (the last one none); the body's '{', '[' and ',' besides
    most = (MAX_BODY_VALUES - 2) // 3
    with OpenAIStub(lambda body: Reply(content=f"{len(body['messages'])} messages")) as up:
        with Served(settings(tmp_path, "record", up.api_base)) as server:
            url = server.url + "/v1/chat/completions"
            headers = {"Content-Type": "application/json"}
            many = requests.post(url, data=_many_messages(480_000), headers=headers, timeout=120)
            over = requests.post(url, data=_many_messages(most + 1), headers=headers, timeout=60)
            at = requests.post(url, data=_many_messages(most), headers=headers, timeout=60)
            long = requests.post(url, data=_big_chat(4 * MIB, 0), headers=headers, timeout=60)
    for refused in (many, over):
        assert refused.status_code == 413 and refused.headers["x-stm-outcome"] == "rejected", refused.text[:300]
        assert refused.headers["x-should-retry"] == "false"
        assert f"at most {MAX_BODY_VALUES:,}" in refused.json()["error"]["message"], refused.text[:300]
    assert at.status_code == 200 and at.headers["x-stm-outcome"] == "recorded", at.text[:300]
    assert at.json()["choices"][0]["message"]["content"] == f"{most} messages"
    assert long.status_code == 200 and long.headers["x-stm-outcome"] == "recorded", long.text[:300]
    assert up.count == 2  # the two bodies read, nothing of the refused ones


@pytest.mark.parametrize("shape", ["one string", "480,000 messages"])
def test_tool_hits_keep_their_latency_beside_large_model_bodies(tmp_path: Path, shape: str) -> None:
    """Two clients posting 15.6 MiB ``/v1`` bodies in a loop beside ``/virtual`` hits: the hits' median stays near its
    own without them (it went from 0.8 to 196-344 ms when the bodies were parsed and hashed on the event loop): a body of one long string is read, one of 480,000 messages refused before its parse (its
    parse held the GIL for 180 ms, and the hits' p99 was 1,009 ms)."""
    tool = {"category": "Data", "tool_name": "Fast Tool", "api_name": "hit", "tool_input": '{"n": 1}', "strip": "", "toolbench_key": ""}
    with DiskcacheStore(tmp_path / "store") as store:
        store.add(Record.from_answer("Data/fast_tool_for_Data/hit", "{'n': 1}", {"error": "", "response": "fast"}, "imported"), None)
    config = {"mode": "replay", "store": {"path": str(tmp_path / "store")}, "limits": {"max_queued_bytes": 256 * MIB}}
    with ServeProcess(tmp_path, config) as server:
        url = server.url + "/virtual"
        _latencies(url, tool, 1.0)  # warmed up
        alone = _latencies(url, tool, 3.0)
        stop = threading.Event()
        posted = [0]

        def big(source: str) -> None:
            body = _big_chat(int(15.6 * MIB), 0) if shape == "one string" else _many_messages(480_000)
            while not stop.is_set():
                import socket

                with socket.create_connection(("127.0.0.1", server.port), source_address=(source, 0)) as sock:
                    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                    while sock.recv(65536):
                        pass
                posted[0] += 1

        threads = [threading.Thread(target=big, args=(f"127.0.0.{i}",), daemon=True) for i in (2, 3)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            beside = _latencies(url, tool, 6.0)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
    print(f"hits alone p50 {_p(alone, .5):.2f} p99 {_p(alone, .99):.2f} ms; beside {posted[0]} large bodies p50 {_p(beside, .5):.2f} "
          f"p99 {_p(beside, .99):.2f} ms")
    assert posted[0] >= 4, "the large bodies were not being sent"
    base50, base99 = _p(alone, 0.5), _p(alone, 0.99)
    p50, p99 = _p(beside, 0.5), _p(beside, 0.99)
    slow = sum(latency > 0.1 for latency in beside)
    figures = (f"hit p50 {base50:.1f} ms alone, {p50:.1f} ms beside {posted[0]} large /v1 bodies (p99 {base99:.1f} / {p99:.1f}); "
               f"{slow} hits over 100 ms")
    print(figures)
    # each large body stopped the loop for its whole parse and key before (170-190 ms here, so about every other
    # body left a hit over 100 ms; a p50 of 196-344 ms in the attack); now only its parse does (about 30 ms), the
    # rest runs in pieces the loop runs between.  A loose bound, for a busy machine: it tells the old way from this
    # one; the figures a change must keep (p99 under 100 ms) are benchmarks/v1_bodies.py's
    assert p50 <= max(5 * base50, 60), figures


# -- 4. a lock held by another process never freezes the server -------------------------------------------


HOLD_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


def test_a_write_lock_held_by_another_process_delays_only_the_calls_that_need_it(tmp_path: Path) -> None:
    """Another process holds ``cache.db-occurrences``' write lock for 10 s and a ``/v1`` call names a run: that call
    gets HTTP 503 after ``store.timeout_s``, and every other request is served meanwhile (a ``/virtual`` hit
    waited as long as the lock was held when the claim waited on the event loop)."""
    tool = {"category": "Data", "tool_name": "Fast Tool", "api_name": "hit", "tool_input": '{"n": 1}', "strip": "", "toolbench_key": ""}
    with DiskcacheStore(tmp_path / "store") as store:
        store.add(Record.from_answer("Data/fast_tool_for_Data/hit", "{'n': 1}", {"error": "", "response": "fast"}, "imported"), None)
    with OpenAIStub(lambda body: Reply(content="answer")) as up:
        config = {"mode": "record", "store": {"path": str(tmp_path / "store"), "timeout_s": 2.0},
                  "llm": {"upstreams": [{"base_url": up.api_base}]}}
        with ServeProcess(tmp_path, config) as server:
            v1 = server.url + "/v1/chat/completions"
            first = requests.post(v1, json=chat("named"), headers={"X-STM-Run": "r1"}, timeout=30)
            assert first.headers["x-stm-key"].endswith("#1")  # the counters' file exists
            holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "store" / "cache.db-occurrences"), "10"],
                                      stdout=subprocess.PIPE, text=True)
            try:
                assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
                with ThreadPoolExecutor(1) as pool:
                    started = time.monotonic()
                    waiting = pool.submit(requests.post, v1, json=chat("named"), headers={"X-STM-Run": "r1"}, timeout=60)
                    time.sleep(0.3)
                    hit_started = time.perf_counter()
                    hit = requests.post(server.url + "/virtual", json=tool, timeout=60)
                    hit_s = time.perf_counter() - hit_started
                    private = requests.post(v1, json=chat("private"), timeout=60)  # the server's own run: in memory
                    blocked = waiting.result()
                    blocked_s = time.monotonic() - started
            finally:
                holder.wait(60)
            after = requests.post(v1, json=chat("named"), headers={"X-STM-Run": "r1"}, timeout=30)
    print(f"while the lock was held: a /virtual hit {hit_s * 1000:.1f} ms, the call naming the run HTTP {blocked.status_code} "
          f"after {blocked_s:.2f} s")
    assert hit.status_code == 200 and hit_s < 2.0, f"a /virtual hit took {hit_s:.2f} s while the lock was held"
    assert private.status_code == 200
    assert blocked.status_code == 503 and "store.timeout_s" in blocked.json()["error"]["message"]
    assert blocked_s < 8, f"the call naming the run waited {blocked_s:.1f} s (store.timeout_s is 2, the lock held 10)"
    assert after.headers["x-stm-key"].endswith("#2")  # the refused call took no number


# -- 5. not every 200 is an answer -----------------------------------------------------------------------


class RawUpstream(ScriptedApp):
    """An upstream that answers each request with the next of ``bodies`` (HTTP 200), as they are."""

    def __init__(self, bodies: list[bytes], echo_query: bool = False) -> None:
        self.bodies = list(bodies)
        self.echo_query = echo_query
        self.port = free_port()
        self.api_base = f"http://127.0.0.1:{self.port}/v1"
        self.count = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        self.count += 1
        if self.echo_query:
            query = scope["query_string"].decode()
            await send_json(send, 200, {"id": "c", "object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": f"you called me with {query}"}, "finish_reason": "stop"}]})
            return
        body = self.bodies.pop(0)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


HOSTILE = [
    json.dumps({"error": {"message": "model overloaded", "type": "server_error"}, "choices": []}).encode(),
    json.dumps({"id": "c", "object": "chat.completion", "choices": [{"message": "hi"}]}).encode(),
    json.dumps({"id": "c", "choices": []}).encode(),
    b"[" * 5000 + b"]" * 5000,
    json.dumps({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                "finish_reason": "stop"}], "usage": {"prompt_tokens": 10**30, "completion_tokens": 7}}).encode(),
]


def test_an_upstream_200_that_is_no_answer_is_passed_on_and_never_recorded(tmp_path: Path) -> None:
    with RawUpstream(HOSTILE) as up:
        with Served(settings(tmp_path, "record", up.api_base)) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
            errors = []
            for _ in range(4):
                with pytest.raises(openai.APIStatusError) as caught:
                    client.chat.completions.create(**chat("hostile"))
                errors.append((caught.value.status_code, caught.value.body["message"]))
            fine = client.chat.completions.create(**chat("hostile"))
            stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]["gpt-4o-mini"]
    assert [status for status, _ in errors] == [502] * 4
    assert "(it holds an error object): model overloaded" in errors[0][1] and "no message object" in errors[1][1]
    assert "has no choices" in errors[2][1] and "without a chat_completions answer" in errors[3][1]
    # the errors took no number: the first well-formed answer is occurrence 1, and its absurd usage counts as nothing
    assert fine.choices[0].message.content == "fine" and stats["recorded"] == 1 and stats["error"] == 4
    assert stats["prompt_tokens"] == 0 and stats["completion_tokens"] == 7
    with Served(settings(tmp_path, "replay")) as server:
        got = requests.post(server.url + "/v1/chat/completions", json=chat("hostile"), timeout=10)
        assert got.status_code == 200 and got.json()["choices"][0]["message"]["content"] == "fine"
        again = requests.post(server.url + "/v1/chat/completions", json=chat("hostile"), timeout=10)
        assert again.status_code == 404


def test_a_record_that_is_no_answer_is_refused_whole_when_streamed(tmp_path: Path) -> None:
    """A record made elsewhere (an older version, an import) with ``choices: [{"message": "hi"}]``: served as recorded,
    and a streamed request of it gets an error answer instead of a cut connection."""
    from stabletoolbench_mirror.core import model_calls as mc

    body = chat("old")
    digest = mc.canonical_digest(mc.parse_request(json.dumps(body)))[0]
    with DiskcacheStore(tmp_path / "store") as store:
        for n in (1, 2):
            store.add(Record(api="@model/gpt-4o-mini/chat_completions", key=mc.record_key(digest, n), source="imported",
                             body=json.dumps({"id": "c", "choices": [{"message": "hi"}]}), origin="old"), None)
    with Served(settings(tmp_path, "replay")) as server:
        plain = requests.post(server.url + "/v1/chat/completions", json=body, timeout=10)
        streamed = requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=10)
    assert plain.status_code == 200 and plain.json()["choices"] == [{"message": "hi"}]
    assert streamed.status_code == 502 and "cannot be streamed" in streamed.json()["error"]["message"]


# -- 6. secrets and bounds -------------------------------------------------------------------------------


def test_a_key_in_the_upstream_urls_query_string_is_masked_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = "azure-key-0123456789abcdef"
    with RawUpstream([], echo_query=True) as up:
        with Served(settings(tmp_path, "record", f"{up.api_base}?api-version=2024-02-01&api-key={secret}")) as server:
            got = requests.post(server.url + "/v1/chat/completions", json=chat("who"), timeout=10)
    content = got.json()["choices"][0]["message"]["content"]
    assert secret not in content and "api-key=***" in content and "api-version=2024-02-01" in content
    from stabletoolbench_mirror.commands.cli import main

    assert main(["snapshot", str(tmp_path / "snap"), "--store", str(tmp_path / "store")]) == 0
    for path in [*(tmp_path / "store").rglob("*"), *(tmp_path / "snap").rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in capsys.readouterr().err


def test_a_flood_of_made_up_model_names_leaves_the_tables_and_the_model_list_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Model names flooding ``/v1`` (cheap 404s in replay) take no row of the per-API table, are not listed by
    ``/v1/models``, and a model that answered keeps its name (the tables' bounds made small, so the flood is quick)."""
    from stabletoolbench_mirror.engine import stats

    monkeypatch.setattr(stats, "MAX_TRACKED_APIS", 50)
    monkeypatch.setattr(stats, "MAX_TRACKED_MODELS", 20, raising=False)  # (raising=False: the code before had no such table)
    tool = {"category": "Data", "tool_name": "Fast Tool", "api_name": "hit", "tool_input": '{"n": 1}', "strip": "", "toolbench_key": ""}
    with DiskcacheStore(tmp_path / "store") as store:
        store.add(Record.from_answer("Data/fast_tool_for_Data/hit", "{'n': 1}", {"error": "", "response": "fast"}, "imported"), None)
    with OpenAIStub(lambda body: Reply(content="real")) as up:
        with Served(settings(tmp_path, "record", up.api_base)) as server:
            assert requests.post(server.url + "/v1/chat/completions", json=chat("real"), timeout=10).status_code == 200
    with Served(settings(tmp_path, "replay")) as server:
        session = requests.Session()
        for n in range(300):
            got = session.post(server.url + "/v1/chat/completions", json={**chat("x"), "model": f"fake-{n}"}, timeout=10)
            assert got.status_code == 404
        assert session.post(server.url + "/v1/chat/completions", json=chat("real"), timeout=10).status_code == 200
        assert session.post(server.url + "/virtual", json=tool, timeout=10).status_code == 200
        snapshot = session.get(server.url + "/stats", timeout=10).json()
        models = [m["id"] for m in session.get(server.url + "/v1/models", timeout=10).json()["data"]]
        run_models = session.get(server.url + "/run/any/v1/models", timeout=10).json()
    assert "Data/fast_tool_for_Data/hit" in snapshot["by_api"]  # not "(other)"
    assert models == ["gpt-4o-mini"] and run_models["data"][0]["id"] == "gpt-4o-mini"
    assert set(snapshot["model_calls"]) == {"gpt-4o-mini", "(other)"} and snapshot["model_calls"]["(other)"]["unanswered"] == 300


def test_a_private_run_of_a_million_distinct_requests_keeps_bounded_memory_and_never_repeats_a_number(tmp_path: Path) -> None:
    """1,000,000 distinct requests in the server's own run: the process's memory grows by a bounded amount (the least
    recently used counters spilled to a file of the run's own; all in memory they took about 240 MB) and each
    request's next occurrence is still 2."""
    import hashlib

    from stabletoolbench_mirror.engine.occurrences import PRIVATE_RUN_LIMIT, PrivateRun, RunCounters

    def digest(n: int) -> str:
        return hashlib.sha256(n.to_bytes(8, "big")).hexdigest()

    async def run() -> tuple[list[int], list[int], float, int]:
        counters = RunCounters(DiskcacheStore(tmp_path / "store"), PrivateRun("mine"), 10.0)
        try:
            firsts = []
            for n in range(1_000_000):
                if await counters.claim("mine", digest(n)) != 1:
                    firsts.append(n)
            grown = rss_mb(os.getpid()) - start
            seconds = [await counters.claim("mine", digest(n)) for n in (0, 1, 499_999, 999_998, 999_999)]
            assert counters.private is not None
            return firsts, seconds, grown, len(counters.private._held)  # noqa: SLF001 - the bounded in-memory map
        finally:
            counters.close()
            counters.store.close()

    import os

    start = rss_mb(os.getpid())
    firsts, seconds, grown, in_memory = asyncio.run(run())
    assert firsts == [] and seconds == [2, 2, 2, 2, 2]
    assert in_memory == PRIVATE_RUN_LIMIT and not (tmp_path / "store" / "cache.db-occurrences").exists()  # never in the store
    # 100,000 counters in memory (about 17 MB), the Bloom filter (2 MiB), a spill batch, SQLite's page caches
    assert grown <= 100, f"1,000,000 requests' counters grew the process by {grown:.0f} MB"


# -- 7. smaller items ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "words"), [
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', "lone UTF-16 surrogate"),
    (b'{"model": "m", "messages": ' + b"[" * 1500 + b"]" * 1500 + b"}", "too deep"),
    (b'{"model": "m", "messages": [], "tools": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}", "too deep"),
])
def test_a_lone_surrogate_or_deep_nesting_is_an_openai_shaped_400(tmp_path: Path, raw: bytes, words: str) -> None:
    with OpenAIStub(lambda body: Reply(content="answer")) as up, Served(settings(tmp_path, "record", up.api_base)) as server:
        got = requests.post(server.url + "/v1/chat/completions", data=raw, headers={"content-type": "application/json"}, timeout=10)
        fine = requests.post(server.url + "/v1/chat/completions", json=chat("after"), timeout=10)
    assert got.status_code == 400 and got.json()["error"]["type"] == "invalid_request_error", got.text[:300]
    assert words in got.json()["error"]["message"] and got.headers["x-should-retry"] == "false"
    assert fine.status_code == 200 and up.count == 1  # nothing of it went upstream, and the server goes on


@pytest.fixture
def paused_redis(tmp_path: Path) -> Iterator[tuple[Any, Callable[[bool], None]]]:
    import os
    import signal

    from tests.helpers.redis_server import RedisServer, require_redis_server

    require_redis_server()
    server = RedisServer(tmp_path / "redis").start()

    def pause(paused: bool) -> None:
        os.kill(server.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    try:
        yield server, pause
    finally:
        pause(False)
        server.close()


@pytest.mark.redis
def test_with_redis_paused_store_timeout_s_bounds_every_v1_store_wait(paused_redis: tuple[Any, Callable[[bool], None]]) -> None:
    redis_server, pause = paused_redis
    with OpenAIStub(lambda body: Reply(content="answer")) as up:
        config = Settings(mode="record", log_level="warning", llm={"upstreams": [{"base_url": up.api_base}]},
                          store={"kind": "redis", "url": redis_server.url, "prefix": "paused", "timeout_s": 1.0})
        with Served(config) as server:
            v1 = server.url + "/v1/chat/completions"
            assert requests.post(v1, json=chat("kept"), timeout=30).status_code == 200
            pause(True)
            try:
                timings = {}
                for label, headers in (("private run", {}), ("named run", {"X-STM-Run": "r"})):
                    started = time.monotonic()
                    got = requests.post(v1, json=chat("kept"), headers=headers, timeout=60)
                    timings[label] = (got.status_code, time.monotonic() - started, got.json()["error"]["message"])
            finally:
                pause(False)
            # a claim that answered after its request gave up is given back then: the run's counter is at its start
            import redis

            from stabletoolbench_mirror.core import model_calls as mc

            name = f"paused:o:r:{mc.canonical_digest(chat('kept'))[0]}"
            watcher = redis.Redis.from_url(redis_server.url, decode_responses=True)
            deadline = time.monotonic() + 30
            while watcher.get(name) not in (None, '{"next":1,"free":[]}'):
                assert time.monotonic() < deadline, watcher.get(name)
                time.sleep(0.05)
            # after a timeout Redis is not asked again for store.timeout_s (stores.redis_connection.Outage): then it answers
            deadline = time.monotonic() + 30
            while (back := requests.post(v1, json=chat("kept"), headers={"X-STM-Run": "r"}, timeout=30)).status_code == 503:
                assert time.monotonic() < deadline, back.text
                time.sleep(0.2)
    print({label: (status, round(seconds, 2)) for label, (status, seconds, _) in timings.items()})
    for label, (status, seconds, message) in timings.items():
        # never "not recorded": the store could not say; at most a few store.timeout_s (1 s), not a hang
        assert status == 503 and seconds < 6, (label, status, seconds, message)
    assert back.status_code == 200 and back.headers["x-stm-key"].endswith("#1")
