"""Recorded model calls through the ``openai`` SDK: ``OpenAI(base_url=<server>/v1)`` against a real upstream on 127.0.0.1.

Record, then replay after a restart with the upstream stopped: plain, ``tools``/``tool_choice`` and
``stream: true`` requests; the same body with its keys reordered is a hit; four identical requests
get the four recorded answers in order, and a fifth in replay the documented error, with nothing
reaching the upstream.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests

from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.serving.server import create_app
from tests.helpers.live import ScriptedApp, UvicornThread, free_port, read_body, send_json
from tests.helpers.redis_server import redis_prefix, redis_server  # noqa: F401

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SECRET = "sk-upstream-secret-0123456789"
CLIENT_KEY = "sk-client-key-abcdefghijkl"


class Upstream(ScriptedApp):
    """An OpenAI-compatible chat server: each answer numbered, tool calls when tools are offered, errors on demand."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.fail_next: list[int] = []
        self.echo_key = False
        self.delay_s = 0.0
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        request = json.loads(body)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        with self._lock:
            self.requests.append(request)
            self.headers.append(headers)
            n = len(self.requests)
            failing = self.fail_next.pop(0) if self.fail_next else None
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if failing is not None:
            await send_json(send, failing, {"error": {"message": f"upstream overloaded ({n})", "type": "server_error", "code": None}})
            return
        content = f"answer {n} to {request['messages'][-1]['content']}"
        if self.echo_key:
            content += " key=" + headers.get("authorization", "").removeprefix("Bearer ")
        message_out: dict[str, Any] = {"role": "assistant", "content": content}
        finish = "stop"
        if request.get("tools"):
            message_out = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": f"Paris{n}"})}}]}
            finish = "tool_calls"
        await send_json(send, 200, {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1700000000 + n, "model": request["model"] + "-0613",
            "system_fingerprint": f"fp_{n}",
            "choices": [{"index": 0, "message": message_out, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 10 + n, "completion_tokens": 5, "total_tokens": 15 + n},
        })



class Served:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._runner = UvicornThread(create_app(settings), self.port)

    def __enter__(self) -> Served:
        self._runner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.__exit__(*exc)

    def client(self, key: str = CLIENT_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)


def settings_for(tmp_path: Path, server_mode: str, up: Upstream | None = None, *, upstream_options: dict[str, Any] | None = None,
                 **llm: Any) -> Settings:
    upstreams = [{"base_url": up.base_url, **(upstream_options or {})}] if up is not None else []
    return Settings(mode=server_mode, store={"path": str(tmp_path / "store")}, log_level="warning",
                    llm={"upstreams": upstreams, **llm})


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


def ask(client: openai.OpenAI, text: str, **extra: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": text}],
                                          temperature=0.2, **extra)


def _stream_text(client: openai.OpenAI, text: str) -> tuple[str, str | None, Any]:
    parts, finish, usage = [], None, None
    for chunk in ask(client, text, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish, usage


def test_record_then_replay_after_a_restart_with_the_upstream_stopped(tmp_path: Path) -> None:
    with Upstream() as up:
        with Served(settings_for(tmp_path, "record", up)) as server:
            client = server.client()
            plain = ask(client, "hello")
            tools = ask(client, "weather?", tools=TOOLS, tool_choice="auto")
            streamed = _stream_text(client, "stream me")
            judged = [ask(client, "judge this").choices[0].message.content for _ in range(4)]
            raw = requests.post(server.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [
                {"role": "user", "content": "hello"}], "temperature": 0.2}, timeout=10)
            stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]["gpt-4o-mini"]
        asked = len(up.requests)
    assert asked == 7 + 1  # the raw request is the second occurrence of "hello": asked too
    assert judged == [f"answer {n} to judge this" for n in (4, 5, 6, 7)]
    assert plain.choices[0].message.content == "answer 1 to hello" and plain.system_fingerprint == "fp_1"
    assert plain.model == "gpt-4o-mini-0613" and plain.usage.prompt_tokens == 11
    call = tools.choices[0].message.tool_calls[0]
    assert tools.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris2"}
    assert streamed[0] == "answer 3 to stream me" and streamed[1] == "stop" and streamed[2]["prompt_tokens"] == 13
    assert raw.headers["x-stm-outcome"] == "recorded" and raw.headers["x-stm-key"].endswith("#2")
    assert stats["requests"] == 8 and stats["upstream_calls"] == 8 and stats["recorded"] == 8
    assert stats["completion_tokens"] == 40

    # the upstream is gone: a new server (a new run) replays every answer, in order, from the store
    with Served(settings_for(tmp_path, "replay")) as server:
        client = server.client()
        assert ask(client, "hello").model_dump() == plain.model_dump()
        # the same body, its keys in another order and spaced otherwise: the same record (occurrence 2)
        reordered = '{"temperature": 0.2,  "messages": [{"content": "hello", "role": "user"}], "model": "gpt-4o-mini"}'
        again = requests.post(server.url + "/v1/chat/completions", data=reordered,
                              headers={"content-type": "application/json"}, timeout=10)
        assert again.status_code == 200 and again.headers["x-stm-outcome"] == "hit"
        assert again.content == raw.content
        assert ask(client, "weather?", tools=TOOLS, tool_choice="auto").model_dump() == tools.model_dump()
        assert _stream_text(client, "stream me") == streamed
        assert [ask(client, "judge this").choices[0].message.content for _ in range(4)] == judged
        with pytest.raises(openai.NotFoundError) as fifth:
            ask(client, "judge this")
        message = fifth.value.body["message"]
        assert "occurrence 5 is not recorded" in message and "gpt-4o-mini" in message
        digest = fifth.value.response.json()["error"]["message"].split("sha256:")[1].split(" ")[0]
        assert "@model/gpt-4o-mini/chat_completions" in message and len(digest) == 64
        assert fifth.value.code == "not_recorded"
        # the error used up no occurrence: asked again, the fifth is still the one missing
        with pytest.raises(openai.NotFoundError) as still:
            ask(client, "judge this")
        assert "occurrence 5 " in still.value.body["message"]
        stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]["gpt-4o-mini"]
        assert stats["upstream_calls"] == 0 and stats["unanswered"] == 2
    assert len(up.requests) == asked  # nothing reached the stopped upstream


def test_upstream_errors_reach_the_client_are_not_recorded_and_use_no_occurrence(tmp_path: Path, upstream: Upstream) -> None:
    with Served(settings_for(tmp_path, "record", upstream)) as server:
        client = server.client()
        upstream.fail_next = [503, 429]
        with pytest.raises(openai.InternalServerError) as first:
            ask(client, "retry me")
        assert first.value.status_code == 503 and "upstream overloaded (1)" in first.value.body["message"]
        with pytest.raises(openai.RateLimitError):
            ask(client, "retry me")
        ok = ask(client, "retry me")
        assert ok.choices[0].message.content == "answer 3 to retry me"
        got = requests.post(server.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [
            {"role": "user", "content": "retry me"}], "temperature": 0.2}, timeout=10)
        assert got.headers["x-stm-key"].endswith("#2")  # the failures took no number: the answer was #1
    with Served(settings_for(tmp_path, "replay")) as server:
        assert ask(server.client(), "retry me").choices[0].message.content == "answer 3 to retry me"


def test_an_unmatched_model_is_an_openai_error_naming_the_model_and_the_key(tmp_path: Path, upstream: Upstream) -> None:
    settings = settings_for(tmp_path, "record", upstream, upstream_options={"models": ["gpt-4*"]})
    with Served(settings) as server:
        with pytest.raises(openai.NotFoundError) as caught:
            server.client().chat.completions.create(model="claude-3", messages=[{"role": "user", "content": "hi"}])
        assert "'claude-3'" in caught.value.body["message"] and "llm.upstreams[].models" in caught.value.body["message"]
        assert caught.value.code == "model_not_found"
        assert ask(server.client(), "hi").choices[0].message.content == "answer 1 to hi"
    assert len(upstream.requests) == 1


def test_the_token_budget_refuses_further_upstream_calls_with_a_429(tmp_path: Path, upstream: Upstream) -> None:
    with Served(settings_for(tmp_path, "record", upstream, max_upstream_tokens=30)) as server:
        client = server.client()
        ask(client, "one")  # 16 tokens
        ask(client, "two")  # 17: 33 in all
        with pytest.raises(openai.RateLimitError) as caught:
            ask(client, "three")
        assert "llm.max_upstream_tokens" in caught.value.body["message"]
        with pytest.raises(openai.RateLimitError):
            ask(client, "one")  # its second occurrence in this run would need the upstream
        # a run named by the client counts from 1: its first "one" is the recorded answer, budget or not
        named = {"X-STM-Run": "rerun-1"}
        assert ask(client, "one", extra_headers=named).choices[0].message.content == "answer 1 to one"
        with pytest.raises(openai.RateLimitError):
            ask(client, "one", extra_headers=named)
    assert len(upstream.requests) == 2


def test_keys_are_in_no_record_log_or_snapshot(tmp_path: Path, upstream: Upstream, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    upstream.echo_key = True
    # the client's own key passed through: echoed by the upstream, masked before it is served and recorded
    with Served(settings_for(tmp_path, "record", upstream)) as server:
        echoed = ask(server.client(), "who am I").choices[0].message.content
        assert upstream.headers[-1]["authorization"] == f"Bearer {CLIENT_KEY}"
    assert CLIENT_KEY not in echoed and "***" in echoed
    # a key from api_key_env: sent upstream in place of the client's, and masked too
    monkeypatch.setenv("MIRROR_TEST_UPSTREAM_KEY", SECRET)
    with Served(settings_for(tmp_path, "record", upstream, upstream_options={"api_key_env": "MIRROR_TEST_UPSTREAM_KEY"})) as server:
        echoed = ask(server.client(), "and now").choices[0].message.content
        assert upstream.headers[-1]["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in echoed and "***" in echoed
    from stabletoolbench_mirror.commands.cli import main

    assert main(["snapshot", str(tmp_path / "snap"), "--store", str(tmp_path / "store")]) == 0
    for path in [*(tmp_path / "store").rglob("*"), *(tmp_path / "snap").rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and CLIENT_KEY.encode() not in data, path
    assert SECRET not in caplog.text and CLIENT_KEY not in caplog.text


def test_a_snapshot_replays_the_model_calls_as_a_frozen_cache_and_cache_ls_finds_them(
        tmp_path: Path, upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    from stabletoolbench_mirror.commands.cli import main

    with Served(settings_for(tmp_path, "record", upstream)) as server:
        first = [ask(server.client(), "same").choices[0].message.content for _ in range(2)]
        tools = ask(server.client(), "weather?", tools=TOOLS)
    assert main(["snapshot", str(tmp_path / "snap"), "--store", str(tmp_path / "store")]) == 0
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["by_source"] == {"model": 3} and manifest["by_category"] == {"@model": 3}
    capsys.readouterr()
    assert main(["cache", "ls", "--source", "model", "--json", "--store", str(tmp_path / "store")]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted(r["key"][-2:] for r in listed) == ["#1", "#1", "#2"]
    assert {r["api"] for r in listed} == {"@model/gpt-4o-mini/chat_completions"}
    for pattern, count in (("gpt-4o*", 3), ("claude*", 0)):
        assert main(["cache", "ls", "--model", pattern, "--json", "--store", str(tmp_path / "store")]) == 0
        assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]) == count

    # a fresh store, the snapshot as a frozen cache, no upstream: agent and judge calls replay from it
    replay = Settings(mode="replay", store={"path": str(tmp_path / "empty")}, frozen_caches=[str(tmp_path / "snap")],
                      log_level="warning")
    with Served(replay) as server:
        assert [ask(server.client(), "same").choices[0].message.content for _ in range(2)] == first
        got = requests.post(server.url + "/v1/chat/completions", json={
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "weather?"}], "temperature": 0.2, "tools": TOOLS},
            timeout=10)
        assert got.headers["x-stm-source"] == "frozen" and got.json() == tools.model_dump(exclude_unset=True)
    assert len(upstream.requests) == 3


def test_virtual_refuses_the_model_calls_category(tmp_path: Path) -> None:
    with Served(settings_for(tmp_path, "record")) as server:
        got = requests.post(server.url + "/virtual", json={"category": "@model", "tool_name": "gpt-4o-mini",
                                                           "api_name": "chat_completions", "tool_input": "{}"}, timeout=10)
    assert got.status_code == 422 and "reserved for recorded model calls" in got.text


def test_two_workers_count_one_run_together(tmp_path: Path, upstream: Upstream) -> None:
    """``serve --workers 2``: the run begins in the master, so identical requests on either worker take 1, 2, 3, 4."""
    from tests.helpers.processes import ServeProcess

    config = {"mode": "record", "store": {"path": str(tmp_path / "store")}, "llm": {"upstreams": [{"base_url": upstream.base_url}]}}
    with ServeProcess(tmp_path, config, workers=2) as server:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "judge"}], "temperature": 0.2}
        keys, workers, runs = [], set(), set()
        while len(workers) < 2 or len(keys) < 8:  # new connections: the kernel spreads them over the workers
            got = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30, headers={"connection": "close"})
            keys.append(got.headers["x-stm-key"].rsplit("#", 1)[1])
            workers.add(got.headers["x-stm-worker"])
            runs.add(got.headers["x-stm-run"])
            assert len(keys) < 200, "one worker answered every request"
        assert keys == [str(n) for n in range(1, len(keys) + 1)] and len(runs) == 1
    assert len(upstream.requests) == len(keys)


@pytest.mark.redis
def test_two_hosts_of_one_redis_store_count_a_named_run_together(tmp_path: Path, upstream: Upstream, redis_server: Any,
                                                                  redis_prefix: str) -> None:
    def host(name: str) -> Served:
        return Served(Settings(mode="record", log_level="warning", store={"kind": "redis", "url": redis_server.url, "prefix": redis_prefix},
                               llm={"upstreams": [{"base_url": upstream.base_url}], "run": "paper-run-1"}))

    with host("a") as a, host("b") as b:
        got = [ask((a if i % 2 else b).client(), "judge").choices[0].message.content for i in range(4)]
    assert got == [f"answer {n} to judge" for n in (1, 2, 3, 4)]
    with host("c") as c:  # the same named run goes on counting on a host started later
        assert ask(c.client(), "judge").choices[0].message.content == "answer 5 to judge"
    with Served(Settings(mode="replay", log_level="warning", store={"kind": "redis", "url": redis_server.url, "prefix": redis_prefix})) as replay:
        assert [ask(replay.client(), "judge").choices[0].message.content for _ in range(4)] == got


def test_bodies_and_answers_are_bounded_and_a_slow_upstream_times_out(tmp_path: Path, upstream: Upstream) -> None:
    with Served(settings_for(tmp_path, "record", upstream, max_body_bytes=4096, timeout_s=1.0)) as server:
        big = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 5000}]}
        got = requests.post(server.url + "/v1/chat/completions", json=big, timeout=10)
        assert got.status_code == 413 and "llm.max_body_bytes" in got.json()["error"]["message"]
        bad = requests.post(server.url + "/v1/chat/completions", data=b"{not json", timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        nomodel = requests.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=10)
        assert nomodel.status_code == 400 and "model" in nomodel.json()["error"]["message"]
        upstream.delay_s = 3.0
        slow = requests.post(server.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [
            {"role": "user", "content": "slow"}]}, timeout=30)
        assert slow.status_code == 504 and "llm.timeout_s" in slow.json()["error"]["message"]
        upstream.delay_s = 0.0
        fine = requests.post(server.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [
            {"role": "user", "content": "slow"}]}, timeout=30)
        assert fine.status_code == 200 and fine.headers["x-stm-key"].endswith("#1")  # the timeout used no number
        metrics = requests.get(server.url + "/metrics", timeout=10).text
        assert 'stm_model_requests_total{model="gpt-4o-mini",outcome="error"} 1.0' in metrics
        assert 'stm_model_tokens_total{kind="completion",model="gpt-4o-mini"}' in metrics
        models = requests.get(server.url + "/v1/models", timeout=10).json()
        assert "gpt-4o-mini" in [m["id"] for m in models["data"]]


def test_doctor_says_what_the_model_calls_will_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from stabletoolbench_mirror.commands.cli import main

    monkeypatch.delenv("MIRROR_UNSET_KEY", raising=False)
    config = tmp_path / "server_config.yml"
    config.write_text(json.dumps({"mode": "record", "llm": {"upstreams": [
        {"base_url": "http://user:pw-in-url-123@127.0.0.1:9/v1", "models": ["gpt-*"], "api_key_env": "MIRROR_UNSET_KEY"}]}}))
    assert main(["doctor", "--config", str(config), "--no-probe"]) == 0  # a server of model calls only: warned, not refused
    out = capsys.readouterr()
    text = out.out + out.err
    assert "model calls:   /v1, record; http://127.0.0.1:9/v1 for gpt-* (key: $MIRROR_UNSET_KEY)" in text
    assert "llm.upstreams[0].api_key_env: $MIRROR_UNSET_KEY is not set" in text and "pw-in-url-123" not in text
    config.write_text(json.dumps({"mode": "record", "llm": {"mode": "record"}}))
    main(["doctor", "--config", str(config), "--no-probe"])
    out = capsys.readouterr()
    assert "no upstream is configured: every model call not recorded gets HTTP 404" in out.out + out.err


def test_refresh_asks_again_and_replaces_the_record(tmp_path: Path, upstream: Upstream) -> None:
    with Served(settings_for(tmp_path, "record", upstream)) as server:
        assert ask(server.client(), "again").choices[0].message.content == "answer 1 to again"
    with Served(settings_for(tmp_path, "record", upstream, mode="refresh")) as server:  # llm.mode over the server's
        got = requests.post(server.url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [
            {"role": "user", "content": "again"}], "temperature": 0.2}, timeout=10)
        assert got.headers["x-stm-outcome"] == "replaced" and got.json()["choices"][0]["message"]["content"] == "answer 2 to again"
    with Served(settings_for(tmp_path, "replay")) as server:
        assert ask(server.client(), "again").choices[0].message.content == "answer 2 to again"
