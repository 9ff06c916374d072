"""The MCP front, driven by the official SDK's client: over HTTP (``serve``'s ``/mcp``) and stdio (the ``mcp`` command).

Real servers on 127.0.0.1, the frozen reference cache, a real simulator stub for the record/replay test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
import requests
import yaml

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from stabletoolbench_mirror.core.naming import change_name, standardize  # noqa: E402
from stabletoolbench_mirror.serving.server import create_app, uvicorn_options  # noqa: E402
from stabletoolbench_mirror.upstream.functions import Target, UpstreamTools, clash_name, iter_query_functions  # noqa: E402
from tests.conftest import make_settings  # noqa: E402
from tests.helpers.live import UvicornThread  # noqa: E402
from tests.helpers.openai_stub import OpenAIStub, Reply  # noqa: E402
from tests.helpers.paths import REPO  # noqa: E402


def _reference_settings(reference_dir: Path, tmp_path: Path, **extra: Any) -> Any:
    return make_settings(
        tmp_path, mode="replay", frozen_caches=[str(reference_dir / "cache")], tools_folder=str(reference_dir / "toolenv/tools"), **extra,
    )


def _reference_functions(reference_dir: Path) -> list[Any]:
    tools = UpstreamTools(reference_dir / "toolenv/tools")
    return [item for item in iter_query_functions([reference_dir / "solvable_queries"], tools) if not isinstance(item, tuple)]


def _name_counts(reference_dir: Path) -> dict[str, set[Target]]:
    """Each upstream function name of the solvable queries and the APIs it is given to."""
    names: dict[str, set[Target]] = {}
    for item in _reference_functions(reference_dir):
        for fn in item.functions:
            names.setdefault(fn.name, set()).add(fn.target)
    return names


def _call_name(payload: dict[str, Any], names: dict[str, set[Target]]) -> tuple[str, dict[str, Any]]:
    """The MCP tool name of a reference call, and its parsed input."""
    target = Target(payload["category"], standardize(payload["tool_name"]), change_name(standardize(payload["api_name"])))
    name = f"{target.api_name}_for_{target.tool_name}"[-64:]
    assert target in names[name]
    if len(names[name]) > 1:
        name = clash_name(name, target)
    return name, json.loads(payload["tool_input"]) if payload["tool_input"].strip() else {}


async def _all_tools(mcp: Any) -> list[Any]:
    """Every tool, page by page (MCP's ``nextCursor``)."""
    page = await mcp.list_tools()
    tools = list(page.tools)
    while page.next_cursor is not None:
        page = await mcp.list_tools(cursor=page.next_cursor)
        tools += page.tools
    return tools


async def _calls(server: Any, calls: list[tuple[str, dict[str, Any]]], **client: Any) -> tuple[list[str], list[Any]]:
    async with Client(server, **client) as mcp:
        listed = await _all_tools(mcp)
        results = [await mcp.call_tool(name, arguments) for name, arguments in calls]
    return [t.name for t in listed], results


def _http(url: str, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60))


def test_http_lists_every_unambiguous_name_and_the_reference_calls_are_hits(reference_dir: Path, reference_calls, tmp_path: Path) -> None:
    settings = _reference_settings(reference_dir, tmp_path, mcp={"enabled": True})  # no queries: the whole tools folder
    names = _name_counts(reference_dir)
    calls = [_call_name(c["payload"], names) for c in reference_calls]
    assert len(calls) == 16
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        listed, results = asyncio.run(_calls(server.url + "/mcp", calls))
        stats = requests.get(server.url + "/stats", timeout=10).json()
        metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert len(listed) == len(set(listed)) == 2490
    unambiguous = {n for n, targets in names.items() if len(targets) == 1}
    assert unambiguous <= set(listed)
    clashing = {clash_name(n, t) for n, targets in names.items() if len(targets) > 1 for t in targets}
    assert set(listed) == unambiguous | clashing
    for result, reference in zip(results, reference_calls):
        [content] = result.content
        assert json.loads(content.text) == reference["observed"]
        assert result.is_error is bool(reference["observed"]["error"])
    assert (stats["requests"], stats["hits"]) == (16, 16)
    assert 'outcome="hit"' in metrics


def test_a_query_endpoint_lists_exactly_its_functions_and_the_token_applies(reference_dir: Path, tmp_path: Path) -> None:
    settings = _reference_settings(reference_dir, tmp_path, auth_token="s3cret",
                                   mcp={"enabled": True, "queries": str(reference_dir / "solvable_queries")})
    items = _reference_functions(reference_dir)
    picked = [items[0], items[len(items) // 2], items[-1]]
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        for item in picked:
            url = f"{server.url}/mcp/queries/{item.group}/{item.query_id}"
            listed, _ = asyncio.run(_calls(_http(url, "s3cret"), []))
            assert listed == [fn.name for fn in item.functions]  # upstream's order, Finish left out
        everything, _ = asyncio.run(_calls(_http(server.url + "/mcp", "s3cret"), []))
        assert len(everything) == 2490  # the queries' APIs together
        # the bearer token guards /mcp as it guards /virtual
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        refused = requests.post(server.url + "/mcp", json=init, headers={"Accept": "application/json, text/event-stream"}, timeout=10)
        assert refused.status_code == 401
        missing = requests.post(server.url + "/mcp/queries/G1_instruction/no-such-id", json=init,
                                headers={"Authorization": "Bearer s3cret"}, timeout=10)
        assert missing.status_code == 404 and "no MCP endpoint" in missing.json()["error"]


def _config_file(tmp_path: Path, reference_dir: Path, **extra: Any) -> Path:
    """A config answering from the frozen reference cache (``mcp.sessions`` at its default: a stdio run is one session,
    whose calls the frozen cache answers with the keys StableToolBench's client gives them)."""
    config = {
        "mode": "replay", "store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(reference_dir / "cache")],
        "tools_folder": str(reference_dir / "toolenv/tools"), "mcp": {"queries": str(reference_dir / "solvable_queries")}, **extra,
    }
    path = tmp_path / "server_config.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _stdio(config: Path, *extra: str) -> StdioServerParameters:
    env = {"PYTHONPATH": str(REPO)}
    return StdioServerParameters(command=sys.executable, args=["-m", "stabletoolbench_mirror", "mcp", "--config", str(config), *extra], env=env)


def test_the_same_calls_over_stdio(reference_dir: Path, reference_calls, tmp_path: Path) -> None:
    names = _name_counts(reference_dir)
    calls = [_call_name(c["payload"], names) for c in reference_calls]
    config = _config_file(tmp_path, reference_dir)
    listed, results = asyncio.run(_calls(_stdio(config), calls))
    assert len(listed) == len(set(listed)) == 2490
    for result, reference in zip(results, reference_calls):
        assert json.loads(result.content[0].text) == reference["observed"]
    item = _reference_functions(reference_dir)[5]
    one, _ = asyncio.run(_calls(_stdio(config, "--query", f"{item.group}/{item.query_id}"), []))
    assert one == [fn.name for fn in item.functions]


def test_an_mcp_session_answers_from_a_frozen_cache_by_default(reference_dir: Path, reference_calls, tmp_path: Path) -> None:
    """``mcp.sessions`` at its default (true) and a handshake-era client (``Mcp-Session-Id``): every call runs in one
    server session, keyed with its history, and the frozen StableToolBench cache, which has no such keys, still answers
    each reference call as it answers StableToolBench's client.  The calls are the session's trajectory (the frozen
    answers in its history); the store's record of a call made outside any session is no answer inside one."""
    from stabletoolbench_mirror.core.records import Record
    from stabletoolbench_mirror.factory import build_session_store
    from stabletoolbench_mirror.stores import DiskcacheStore

    settings = _reference_settings(reference_dir, tmp_path, mcp={"enabled": True})
    assert settings.mcp.sessions is True
    names = _name_counts(reference_dir)
    calls = [_call_name(c["payload"], names) for c in reference_calls]
    # a call the frozen cache has no answer for, recorded in the store outside any session (e.g. by warm)
    first = reference_calls[0]["payload"]
    stored_only = (calls[0][0], {"stored": "outside a session"})
    with DiskcacheStore(settings.resolve(settings.store.path)) as store:
        from stabletoolbench_mirror.core.call import ToolCall

        call = ToolCall.of(first["category"], first["tool_name"], first["api_name"], stored_only[1])
        store.add(Record.from_answer(call.api, call.key, {"error": "", "response": "made without history"}, "simulated", "m"),
                  call.canonical)
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        _, results = asyncio.run(_calls(server.url + "/mcp", [*calls, stored_only], mode="legacy"))
        stats = requests.get(server.url + "/stats", timeout=10).json()
        # the same stored call outside a session (the 2026 era keeps none) is that record's hit
        _, outside = asyncio.run(_calls(server.url + "/mcp", [stored_only]))
    for result, reference in zip(results, reference_calls):
        assert json.loads(result.content[0].text) == reference["observed"]
    assert "API not working error" in json.loads(results[-1].content[0].text)["error"]  # a miss in a session
    assert json.loads(outside[0].content[0].text) == {"error": "", "response": "made without history"}
    assert (stats["requests"], stats["hits"]) == (17, 16)
    sessions = build_session_store(settings)
    try:
        [session] = list(sessions)
    finally:
        sessions.close()
    assert [c["source"] for c in session["calls"]] == ["frozen"] * 16 + [None]
    assert [c["in_history"] for c in session["calls"]] == [True] * 16 + [False]


class CountingModel:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.n += 1
        return Reply(content=json.dumps({"error": "", "response": f"answer #{self.n}"}))


def test_mcp_calls_recorded_in_record_mode_replay_identically_after_a_restart(reference_dir: Path, tmp_path: Path) -> None:
    item = _reference_functions(reference_dir)[0]
    url_path = f"/mcp/queries/{item.group}/{item.query_id}"
    with OpenAIStub(CountingModel()) as stub:
        record = make_settings(
            tmp_path, mode="record", tools_folder=str(reference_dir / "toolenv/tools"),
            simulator={"enabled": True, "style": "gpt-fewshot", "api_base": stub.api_base, "max_retries": 0, "model": "m", "history": 8},
            mcp={"enabled": True, "queries": str(reference_dir / "solvable_queries" / f"{item.group}.json")},
        )
        calls = [(fn.name, {"unknown_probe": i}) for i, fn in enumerate(item.functions)]
        with UvicornThread(create_app(record), **uvicorn_options(record)) as server:
            # handshake era: the MCP session is one server session (history-conditioned simulation)
            _, first = asyncio.run(_calls(server.url + url_path, calls, mode="legacy"))
            sessions_held = requests.get(server.url + "/stats", timeout=10).json()
        assert stub.count == len(calls)
        # the second call's prompt shows the first call's answer: both ran in one server session
        assert "answer #1" in json.dumps(stub.requests[1]["messages"])
    assert sessions_held["requests"] == len(calls)
    replay = make_settings(tmp_path, mode="replay", tools_folder=str(reference_dir / "toolenv/tools"),
                           mcp={"enabled": True, "queries": record.mcp.queries})
    with UvicornThread(create_app(replay), **uvicorn_options(replay)) as server:
        # a new MCP session: a new server session, whose calls in the same order have the same history keys
        _, again = asyncio.run(_calls(server.url + url_path, calls, mode="legacy"))
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert [r.content[0].text for r in again] == [r.content[0].text for r in first]
    assert [json.loads(r.content[0].text)["response"] for r in first] == [f"answer #{i + 1}" for i in range(len(calls))]
    assert stats["hits"] == len(calls)


def test_the_example_client_runs_as_written(reference_dir: Path, tmp_path: Path) -> None:
    settings = _reference_settings(reference_dir, tmp_path, mcp={"enabled": True, "queries": str(reference_dir / "solvable_queries")})
    item = _reference_functions(reference_dir)[0]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = REPO / "examples/mcp/client.py"
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        run = subprocess.run([sys.executable, str(script), f"{server.url}/mcp/queries/{item.group}/{item.query_id}"],
                             capture_output=True, text=True, timeout=120, env=env)
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert lines[0] == {"tools": [fn.name for fn in item.functions]}
    assert [line["tool"] for line in lines[1:]] == [fn.name for fn in item.functions]
    for line in lines[1:]:
        assert set(json.loads(line["text"])) == {"error", "response"}
    assert stats["requests"] == len(item.functions)
    config = _config_file(tmp_path, reference_dir)
    stdio = subprocess.run(
        [sys.executable, str(script), "--stdio", "--", sys.executable, "-m", "stabletoolbench_mirror", "mcp", "--config", str(config),
         "--query", f"{item.group}/{item.query_id}"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert stdio.returncode == 0, stdio.stderr
    assert [json.loads(line) for line in stdio.stdout.splitlines()][0] == lines[0]


def test_bad_mcp_settings_fail_at_start_naming_the_key(reference_dir: Path, tmp_path: Path) -> None:
    from stabletoolbench_mirror.config import ConfigError

    with pytest.raises(ConfigError, match="mcp.enabled: the MCP front needs tool docs: set tools_folder"):
        create_app(make_settings(tmp_path, mcp={"enabled": True}))
    with pytest.raises(ConfigError, match="mcp.queries: .*no such file or folder"):
        create_app(_reference_settings(reference_dir, tmp_path, mcp={"enabled": True, "queries": str(tmp_path / "nope")}))


def _record_settings(tmp_path: Path, reference_dir: Path, stub: OpenAIStub, queries: Path) -> Any:
    return make_settings(
        tmp_path, mode="record", tools_folder=str(reference_dir / "toolenv/tools"),
        simulator={"enabled": True, "style": "gpt-fewshot", "api_base": stub.api_base, "max_retries": 0, "model": "m", "history": 8},
        mcp={"enabled": True, "queries": str(queries)},
    )


def test_x_stm_session_names_the_server_session_and_an_unknown_tool_calls_nothing(reference_dir: Path, tmp_path: Path) -> None:
    item = _reference_functions(reference_dir)[0]
    with OpenAIStub(CountingModel()) as stub:
        settings = _record_settings(tmp_path, reference_dir, stub, reference_dir / "solvable_queries" / f"{item.group}.json")
        with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
            session = requests.post(server.url + "/sessions", json={"task": "t"}, timeout=10).json()["id"]
            client = streamable_http_client(server.url + "/mcp", http_client=httpx2.AsyncClient(headers={"X-STM-Session": session}, timeout=60))
            calls = [(item.functions[0].name, {"a": 1}), ("no_such_tool", {}), (item.functions[1].name, {"b": 2})]
            _, results = asyncio.run(_calls(client, calls))  # the 2026 era: no MCP session, the header names one
            kept = requests.get(f"{server.url}/sessions/{session}", timeout=10).json()
            stats = requests.get(server.url + "/stats", timeout=10).json()
    assert json.loads(results[1].content[0].text) == {"error": "No such function name: no_such_tool", "response": ""}
    assert results[1].is_error and not results[0].is_error
    assert [c["tool_input"] for c in kept["calls"]] == [{"a": 1}, {"b": 2}]
    assert stats["requests"] == 2 and stub.count == 2


def test_a_stdio_run_is_one_server_session(reference_dir: Path, tmp_path: Path) -> None:
    item = _reference_functions(reference_dir)[0]
    with OpenAIStub(CountingModel()) as stub:
        config = {
            "mode": "record", "store": {"path": str(tmp_path / "store")}, "tools_folder": str(reference_dir / "toolenv/tools"),
            "simulator": {"enabled": True, "style": "gpt-fewshot", "api_base": stub.api_base, "max_retries": 0, "model": "m"},
            "mcp": {"queries": str(reference_dir / "solvable_queries" / f"{item.group}.json")},
        }
        path = tmp_path / "server_config.yml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        calls = [(fn.name, {"n": i}) for i, fn in enumerate(item.functions[:2])]
        _, results = asyncio.run(_calls(_stdio(path, "--query", f"{item.group}/{item.query_id}"), calls))
        assert [json.loads(r.content[0].text)["response"] for r in results] == ["answer #1", "answer #2"]
        assert "answer #1" in json.dumps(stub.requests[1]["messages"])  # the history of one session


def test_mcp_calls_take_the_clients_in_flight_slots_of_virtual(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from stabletoolbench_mirror.engine.layer import MirrorLayer
    from stabletoolbench_mirror.stores import DiskcacheStore
    from tests.helpers.responders import KeyedResponder

    tools = tmp_path / "tools" / "Data"
    tools.mkdir(parents=True)
    doc = {"tool_name": "Slow Tool", "tool_description": "", "api_list": [
        {"name": "wait", "description": "", "method": "GET", "required_parameters": [], "optional_parameters": []}]}
    (tools / "slow_tool.json").write_text(json.dumps(doc), encoding="utf-8")
    settings = make_settings(tmp_path, tools_folder=str(tmp_path / "tools"), mcp={"enabled": True},
                             limits={"max_in_flight_per_client": 1, "queue_timeout_s": 0.5})
    responder = KeyedResponder(delay_s=2.0)
    layer = MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder])
    slow = {"category": "Data", "tool_name": "slow_tool", "api_name": "wait", "tool_input": "{\"n\": 1}", "strip": "", "toolbench_key": ""}
    with UvicornThread(create_app(settings, layer), **uvicorn_options(settings)) as server, ThreadPoolExecutor(1) as side:
        held = side.submit(requests.post, server.url + "/virtual", json=slow, timeout=30)  # holds the client's one slot
        deadline = time.monotonic() + 10
        while responder.active < 1:  # the slow call holds the slot now
            assert time.monotonic() < deadline and not held.done(), "the slow call never reached its responder"
            time.sleep(0.01)
        _, [refused] = asyncio.run(_calls(server.url + "/mcp", [("wait_for_slow_tool", {"n": 2})]))
        assert held.result().status_code == 200
        stats = requests.get(server.url + "/stats", timeout=10).json()
    body = json.loads(refused.content[0].text)
    assert refused.is_error and "limits.queue_timeout_s" in body["error"]
    assert stats["requests"] == 2 and stats["refusals"] == {"limits.queue_timeout_s": 1}


def test_api_bank_tools_are_offered_over_mcp_and_run_through_the_layer(reference_dir: Path, tmp_path: Path) -> None:
    apibank = reference_dir.parent / "reference" / "apibank"
    if not (apibank / "apis").is_dir():
        pytest.skip(f"API-Bank's reference copy not found at {apibank}")
    # no tools_folder: /mcp offers the tools registered for API-Bank (apibank:), and they run here
    settings = make_settings(tmp_path, mode="record", apibank={"path": str(apibank)}, mcp={"enabled": True, "sessions": False})
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        listed, results = asyncio.run(_calls(server.url + "/mcp", [("calculator_for_api_bank", {"formula": "(1+2)*3"})]))
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert "calculator_for_api_bank" in listed and "addagenda_for_api_bank" in listed
    assert "dictionary_for_api_bank" in listed  # documented, answered on the miss path
    [content] = results[0].content
    body = json.loads(content.text)
    assert body["error"] == "" and json.loads(body["response"])["output"] == 9.0
    assert stats["requests"] == 1


def test_the_example_client_calls_recorded_inputs_of_the_frozen_cache_and_shows_answers(reference_dir: Path, tmp_path: Path) -> None:
    """Against the frozen cache, example values are misses (``isError``); ``--frozen`` sends inputs the tree holds."""
    settings = _reference_settings(reference_dir, tmp_path, mcp={"enabled": True, "queries": str(reference_dir / "solvable_queries")})
    (item,) = [i for i in _reference_functions(reference_dir) if (i.group, i.query_id) == ("G1_instruction", "588")]
    recorded = {fn.name for fn in item.functions
                if (reference_dir / "cache" / fn.target.category / f"{fn.target.tool_name}_for_{fn.target.category}" / f"{fn.target.api_name}.json").exists()}
    assert len(item.functions) == 10 and len(recorded) == 7
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        url = f"{server.url}/mcp/queries/{item.group}/{item.query_id}"
        as_before = subprocess.run([sys.executable, str(REPO / "examples/mcp/client.py"), url], capture_output=True, text=True, timeout=120, env=env)
        shown = subprocess.run([sys.executable, str(REPO / "examples/mcp/client.py"), url, "--frozen", str(reference_dir / "cache")],
                               capture_output=True, text=True, timeout=120, env=env)
    assert as_before.returncode == 0 and shown.returncode == 0, as_before.stderr + shown.stderr
    before = {line["tool"]: line for line in map(json.loads, as_before.stdout.splitlines()[1:])}
    after = {line["tool"]: line for line in map(json.loads, shown.stdout.splitlines()[1:])}
    assert all(line["isError"] for line in before.values())  # the trap: every example value is a miss
    for name in recorded:
        assert not after[name]["isError"], after[name]
        assert json.loads(after[name]["text"])["error"] == ""


async def _pages_over_client_session(url: str) -> list[list[str]]:
    """The tool names of each ``tools/list`` page, listed by the SDK's ``ClientSession`` over ``streamable_http_client``
    (its default 1 MiB limit on one server-sent event)."""
    import mcp_types as types
    from mcp.client.session import ClientSession

    pages = []
    async with streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=60)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        cursor = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            pages.append([t.name for t in page.tools])
            if page.next_cursor is None:
                return pages
            cursor = page.next_cursor


@pytest.mark.parametrize("with_queries", [True, False])
def test_the_sdks_client_session_lists_every_tool_page_by_page(reference_dir: Path, tmp_path: Path, with_queries: bool) -> None:
    queries = {"queries": str(reference_dir / "solvable_queries")} if with_queries else {}
    settings = _reference_settings(reference_dir, tmp_path, mcp={"enabled": True, **queries})
    items = _reference_functions(reference_dir)
    assert len(items) == 765 or not with_queries  # every solvable query
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        pages = asyncio.run(_pages_over_client_session(server.url + "/mcp"))
        item = max(items, key=lambda i: len(i.functions))
        one_query = asyncio.run(_pages_over_client_session(f"{server.url}/mcp/queries/{item.group}/{item.query_id}")) if with_queries else None
        # a cursor the server never gave is an error naming it, not an empty page
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        opened = requests.post(server.url + "/mcp", json=init, headers=accept, timeout=30)
        headers = {**accept, "Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
        requests.post(server.url + "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers, timeout=30)
        bad = requests.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "nope"}},
                            headers=headers, timeout=30)
    listed = [name for page in pages for name in page]
    assert len(pages) >= 5 and len(listed) == len(set(listed)) == 2490
    assert listed == [t.name for t in _catalog_listing(settings)]  # every tool once, in the catalog's order
    assert one_query == ([[fn.name for fn in item.functions]] if with_queries else None)  # one query's tools: one page
    assert "unknown cursor 'nope'" in bad.text and '"code":-32602' in bad.text.replace(" ", "")


def _catalog_listing(settings: Any) -> list[Any]:
    from stabletoolbench_mirror.serving.mcp_catalog import Catalog

    return Catalog.from_settings(settings).listing(None)
