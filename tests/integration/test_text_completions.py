"""Text completions (``POST /v1/completions``) as ToolLLaMA's agent sends them, runs named in the URL, a second
evaluation in one run, and two ``serve`` processes on one store: through the ``openai`` SDK, against real
servers on 127.0.0.1.

``qa_pipeline --backbone_model toolllama_vllm`` calls ``client.completions.create(model=..., prompt=...,
temperature=0, max_tokens=1024, stop="</s>", echo=False, extra_body={"truncate_prompt_tokens": 7168})`` and
reads ``response.model_dump()["usage"]["total_tokens"]`` and ``["choices"][0]["text"]`` (ReAct text).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import requests

from stabletoolbench_mirror.config import Settings
from tests.helpers.live import free_port
from tests.helpers.model_stubs import JudgeStub, ToolLlamaStub, toolllama_text
from tests.helpers.processes import REPO, ServeProcess, _clean_env
from tests.integration.test_model_calls import Served

MODEL = "ToolBench/ToolLLaMA-2-7b-v2"
FUNCTIONS = [
    {"name": "current_weather_for_demo_weather", "description": "the weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "example_value": "Paris"}}, "required": ["city"]}},
    {"name": "Finish", "description": "the final answer",
     "parameters": {"type": "object", "properties": {"return_type": {"type": "string"}}, "required": ["return_type"]}},
]
SYSTEM = ("You are AutoGPT, you can use many tools(functions) to do the following task.\nAt each step, you need to give your "
          "thought to analyze the status now and what to do next, with a function call to actually excute your step. Your output "
          "should follow this format:\nThought:\nAction\nAction Input:\n\nSpecifically, you have access to the following APIs: "
          + str(FUNCTIONS))


def prompt(query: str, tool_result: str | None = None) -> str:
    """ToolLLaMA's prompt as upstream's ``ToolLLaMA_vllm.parse`` builds it (roles System, User, Function, Assistant)."""
    text = f"System: {SYSTEM}\nUser: {query}\n"
    if tool_result is not None:
        text += f"Assistant: Thought: call it\nAction: current_weather_for_demo_weather\nAction Input: {{}}\nFunction: {tool_result}\n"
    return text + "Assistant:\n"


def toolllama(client: openai.OpenAI, text: str, **extra: Any) -> Any:
    """The call of upstream's ``completion_request`` (toolbench/inference/LLM/tool_llama_vllm_model.py)."""
    return client.completions.create(model=MODEL, prompt=text, temperature=0, max_tokens=1024, stop="</s>", echo=False,
                                     extra_body={"truncate_prompt_tokens": 7168}, **extra)


def react_parser(string: str) -> tuple[str, str, str]:
    """Upstream's ``toolbench.inference.utils.react_parser``, as it is."""
    thought = string[string.find("Thought: ") + len("Thought: "): string.find("\nAction: ")]
    action = string[string.find("Action: ") + len("Action: "): string.find("\nAction Input: ")]
    return thought, action, string[string.find("Action Input: ") + len("Action Input: "):]


def settings(tmp_path: Path, mode: str, upstream: Any = None, **llm: Any) -> Settings:
    upstreams = [{"base_url": upstream.api_base}] if upstream is not None else []
    return Settings(mode=mode, store={"path": str(tmp_path / "store")}, log_level="warning", llm={"upstreams": upstreams, **llm})


def client_of(url: str, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="EMPTY", **{"max_retries": 0, "timeout": 30, **options})


def _streamed(client: openai.OpenAI, text: str) -> tuple[str, str | None, Any, set[str]]:
    parts, finish, usage, kinds = [], None, None, set()
    for chunk in toolllama(client, text, stream=True, stream_options={"include_usage": True}):
        kinds.add(chunk.object)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            parts.append(choice.text)
            finish = choice.finish_reason or finish
    return "".join(parts), finish, usage, kinds


def test_toolllama_text_completions_record_then_replay_after_a_restart_with_the_upstream_stopped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, result = prompt("How is the weather in 'Paris'?"), prompt("How is the weather in 'Paris'?", '{"temp": 14}')
    with ToolLlamaStub() as upstream:
        with Served(settings(tmp_path, "record", upstream)) as server:
            client = client_of(server.url + "/v1")
            plain = toolllama(client, first).model_dump()
            finish = toolllama(client, result).model_dump()
            streamed = _streamed(client, "User: stream me\nAssistant:\n")
            again = [toolllama(client, first).id for _ in range(2)]  # occurrences 2 and 3 of the first prompt
            listed = requests.get(server.url + "/v1/models", timeout=10).json()
            stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"][MODEL]
            metrics = requests.get(server.url + "/metrics", timeout=10).text
        asked = upstream.count
        sent = upstream.requests[0]
    assert asked == 5
    # as the SDK sends it: extra_body merged into the body, stop and echo kept, no stream asked upstream
    assert sent["truncate_prompt_tokens"] == 7168 and sent["stop"] == "</s>" and sent["echo"] is False and "stream" not in sent
    assert plain["object"] == "text_completion" and plain["usage"]["total_tokens"] > 0
    thought, action, action_input = react_parser(plain["choices"][0]["text"])
    assert action == "current_weather_for_demo_weather" and json.loads(action_input) == {"city": "Paris"} and thought
    assert react_parser(finish["choices"][0]["text"])[1] == "Finish"
    assert streamed[0] == toolllama_text("User: stream me\nAssistant:\n") and streamed[1] == "stop"
    assert streamed[2]["total_tokens"] > 0 and streamed[3] == {"text_completion"}
    assert len({plain["id"], *again}) == 3  # three occurrences, three recorded answers
    assert MODEL in [m["id"] for m in listed["data"]]
    assert stats["requests"] == 5 and stats["recorded"] == 5 and stats["upstream_calls"] == 5 and stats["prompt_tokens"] > 0
    assert f'stm_model_requests_total{{model="{MODEL}",outcome="recorded"}} 5.0' in metrics

    # the upstream is gone: a new server replays every answer, in order, streamed or not
    with Served(settings(tmp_path, "replay")) as server:
        client = client_of(server.url + "/v1")
        assert toolllama(client, first).model_dump() == plain
        assert toolllama(client, result).model_dump() == finish
        assert _streamed(client, "User: stream me\nAssistant:\n") == streamed
        assert [toolllama(client, first).id for _ in range(2)] == again
        got = requests.post(server.url + "/v1/completions", timeout=10, json={
            "model": MODEL, "prompt": first, "temperature": 0, "max_tokens": 1024, "stop": "</s>", "echo": False,
            "truncate_prompt_tokens": 7168, "stream": True})  # its key is the unstreamed one's: recorded three times
        assert got.status_code == 404 and got.json()["error"]["code"] == "not_recorded"
        assert "was recorded 3 time(s)" in got.json()["error"]["message"]
        assert "@model/ToolBench/ToolLLaMA-2-7b-v2/completions" in got.json()["error"]["message"]
    from stabletoolbench_mirror.commands.cli import main

    capsys.readouterr()
    assert main(["cache", "ls", "--model", "ToolBench/*", "--json", "--store", str(tmp_path / "store")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(rows) == 5 and {r["api"] for r in rows} == {f"@model/{MODEL}/completions"}


def test_a_prompt_list_and_a_bad_text_request(tmp_path: Path) -> None:
    with ToolLlamaStub() as upstream, Served(settings(tmp_path, "record", upstream)) as server:
        client = client_of(server.url + "/v1")
        listed = client.completions.create(model=MODEL, prompt=["User: one\nAssistant:\n"], max_tokens=5)
        assert listed.choices[0].text.startswith("Thought: ")
        bad = requests.post(server.url + "/v1/completions", json={"model": MODEL, "messages": []}, timeout=10)
        assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]
        assert bad.headers["x-should-retry"] == "false"
        wrong = requests.get(server.url + "/v1/completions", timeout=10)
        assert wrong.status_code == 405 and "POST /v1/completions" in wrong.json()["error"]["message"]
    assert upstream.count == 1


def judge(client: openai.OpenAI, text: str = "is it solved?") -> Any:
    return client.chat.completions.create(model="gpt-3.5-turbo-16k", messages=[{"role": "user", "content": text}],
                                          temperature=0.2, tools=[{"type": "function", "function": {
                                              "name": "check_answer_status", "parameters": {"type": "object", "properties": {}}}}],
                                          tool_choice={"type": "function", "function": {"name": "check_answer_status"}})


def test_a_run_named_in_the_url_is_the_run_of_the_header(tmp_path: Path) -> None:
    with JudgeStub(seed=3) as upstream:
        with Served(settings(tmp_path, "record", upstream)) as server:
            recorded = [judge(client_of(server.url + "/v1")).id for _ in range(4)]
    with Served(settings(tmp_path, "replay")) as server:
        # StableToolBench's judge cannot send headers: its api_base names the run
        for run in ("eval-1", "eval-2"):
            client = client_of(f"{server.url}/run/{run}/v1")
            assert [judge(client).id for _ in range(4)] == recorded
            raw = requests.post(f"{server.url}/run/{run}/v1/chat/completions", json={"model": "x", "messages": []}, timeout=10)
            assert raw.status_code in (404,) and raw.json()["error"]["code"] == "not_recorded"
        # the same counters as the header's: eval-1 has used its four
        by_header = requests.post(server.url + "/v1/chat/completions", headers={"X-STM-Run": "eval-1"}, timeout=10, json={
            "model": "gpt-3.5-turbo-16k", "messages": [{"role": "user", "content": "is it solved?"}], "temperature": 0.2,
            "tools": [{"type": "function", "function": {"name": "check_answer_status", "parameters": {"type": "object", "properties": {}}}}],
            "tool_choice": {"type": "function", "function": {"name": "check_answer_status"}}})
        assert by_header.status_code == 404 and "occurrence 5 is not recorded" in by_header.json()["error"]["message"]
        named = client_of(f"{server.url}/run/eval%203/v1")  # percent-encoded, as the header's bytes
        got = named.chat.completions.with_raw_response.create(model="gpt-3.5-turbo-16k", messages=[
            {"role": "user", "content": "is it solved?"}], temperature=0.2, tools=[{"type": "function", "function": {
                "name": "check_answer_status", "parameters": {"type": "object", "properties": {}}}}],
            tool_choice={"type": "function", "function": {"name": "check_answer_status"}})
        assert got.headers["x-stm-run"] == "eval 3" and got.headers["x-stm-key"].endswith("#1")
        models = requests.get(f"{server.url}/run/eval-9/v1/models", timeout=10)
        assert models.status_code == 200 and "gpt-3.5-turbo-16k" in [m["id"] for m in models.json()["data"]]
        # the header's rules, and no second name
        for url, headers, status in ((f"{server.url}/run/{'r' * 201}/v1/chat/completions", {}, 400),
                                     (f"{server.url}/run/a%0Ab/v1/chat/completions", {}, 400),
                                     (f"{server.url}/run/a/v1/chat/completions", {"X-STM-Run": "b"}, 400),
                                     (f"{server.url}/run/a/chat/completions", {}, 404)):
            bad = requests.post(url, json={"model": "gpt-3.5-turbo-16k", "messages": []}, headers=headers, timeout=10)
            assert bad.status_code == status and "error" in bad.json(), (url, bad.text)
        same = requests.post(f"{server.url}/run/a/v1/chat/completions", json={"model": "m", "messages": []},
                             headers={"X-STM-Run": "a"}, timeout=10)
        assert same.status_code == 404 and "(run 'a')" in same.json()["error"]["message"]


def test_a_second_evaluation_in_one_run_is_told_what_to_do_at_once(tmp_path: Path) -> None:
    with JudgeStub(seed=5) as upstream:
        with Served(settings(tmp_path, "record", upstream)) as server:
            for _ in range(3):
                judge(client_of(server.url + "/v1"))
    with Served(settings(tmp_path, "replay")) as server:
        client = client_of(server.url + "/v1", max_retries=2)  # the SDK's default retries: none for this answer
        for _ in range(3):
            judge(client)
        with pytest.raises(openai.NotFoundError) as second:
            judge(client)  # the first request of a second evaluation against the same server
        message = second.value.body["message"]
        assert "occurrence 4 is not recorded: it was recorded 3 time(s)" in message and "second evaluation" in message
        for fix in ("restart `serve`", "llm.run", "X-STM-Run", "/run/<new name>/v1"):
            assert fix in message
        assert second.value.response.headers["x-should-retry"] == "false"
        with pytest.raises(openai.NotFoundError) as never:
            judge(client, "never asked")
        assert "occurrence 1 is not recorded, and in replay mode" in never.value.body["message"]
        stats = requests.get(server.url + "/stats", timeout=10).json()["model_calls"]["gpt-3.5-turbo-16k"]
        assert stats["unanswered"] == 2  # one request each: the SDK sent neither again


def _serve_args(config: Path) -> list[str]:
    return [sys.executable, "-m", "stabletoolbench_mirror", "serve", "--config", str(config)]


def test_two_serve_processes_on_one_store_count_a_named_run_together_and_refuse_two_unnamed(tmp_path: Path) -> None:
    store = {"path": str(tmp_path / "store")}
    with ToolLlamaStub() as upstream:
        named = {"mode": "record", "store": store, "llm": {"upstreams": [{"base_url": upstream.api_base}], "run": "paper-1"}}
        with ServeProcess(tmp_path, named) as a, ServeProcess(tmp_path, named) as b:
            ids = [toolllama(client_of((a if i % 2 else b).url + "/v1"), prompt("judge me")).id for i in range(6)]
            keys = [requests.post((a if i % 2 else b).url + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": "again", "max_tokens": 5}).headers["x-stm-key"][-2:] for i in range(4)]
        assert len(set(ids)) == 6 and keys == ["#1", "#2", "#3", "#4"]
        assert upstream.count == 10

        unnamed = {"mode": "record", "store": store, "llm": {"upstreams": [{"base_url": upstream.api_base}]}}
        with ServeProcess(tmp_path, unnamed) as first:
            config = tmp_path / "second.yml"
            config.write_text(json.dumps({**unnamed, "port": free_port(), "log_level": "warning"}))
            second = subprocess.run(_serve_args(config), cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=120)
            assert second.returncode == 2, second.stdout + second.stderr
            for words in ("another server records model calls into this store", f"process {first.pid}", "llm.run",
                          "serve --workers N"):
                assert words in second.stderr, second.stderr
            # what stays legitimate beside it: a replay server, and a server of tool calls only
            with ServeProcess(tmp_path, {**unnamed, "llm": {**unnamed["llm"], "mode": "replay"}}) as replay:
                assert requests.get(replay.url + "/health", timeout=10).ok
            with ServeProcess(tmp_path, {"mode": "record", "store": store}) as tools_only:
                assert requests.get(tools_only.url + "/health", timeout=10).ok
            assert toolllama(client_of(first.url + "/v1"), prompt("judge me")).id
        # the first has stopped: its lock went with it
        with ServeProcess(tmp_path, unnamed) as after:
            assert requests.get(after.url + "/health", timeout=10).ok


def test_served_is_called_with_every_record_served(tmp_path: Path) -> None:
    from stabletoolbench_mirror.core.records import Record
    from stabletoolbench_mirror.serving.server import create_app
    from tests.helpers.live import UvicornThread

    seen: list[Record] = []
    with ToolLlamaStub() as upstream:
        app = create_app(settings(tmp_path, "record", upstream))
        app.state.model_calls.served = seen.append
        port = free_port()
        with UvicornThread(app, port):
            client = client_of(f"http://127.0.0.1:{port}/v1")
            recorded = toolllama(client, prompt("copy me"))
            with pytest.raises(openai.BadRequestError):
                client.completions.create(model=MODEL, prompt=[])  # refused: nothing served
    app = create_app(settings(tmp_path, "replay"))
    app.state.model_calls.served = seen.append
    with UvicornThread(app, port):
        assert toolllama(client_of(f"http://127.0.0.1:{port}/v1"), prompt("copy me")).id == recorded.id
    assert [(r.api, r.key[-2:], r.source) for r in seen] == [(f"@model/{MODEL}/completions", "#1", "model")] * 2
    assert json.loads(seen[0].body)["id"] == recorded.id and seen[0].body == seen[1].body
