"""Live MCP servers as an upstream tier: real third-party servers recorded through ``/mcp``, then replayed with
every one of them stopped; a server down, with and without the simulator; hostile servers.

The servers are the real ones from PyPI and npm (:mod:`tests.helpers.mcp_servers`); the client is the official
SDK's, over streamable HTTP, as an agent's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

pytest.importorskip("mcp")

from stabletoolbench_mirror.serving.server import create_app, uvicorn_options  # noqa: E402
from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore  # noqa: E402
from tests.conftest import make_settings  # noqa: E402
from tests.helpers import mcp_servers as servers  # noqa: E402
from tests.helpers.live import UvicornThread  # noqa: E402
from tests.helpers.openai_stub import OpenAIStub, Reply  # noqa: E402
from tests.helpers.paths import REPO  # noqa: E402

ROGUE = str(REPO / "tests" / "helpers" / "rogue_mcp_server.py")


def _serve(tmp_path: Path, mode: str, mcp_servers: Any, **extra: Any) -> UvicornThread:
    settings = make_settings(tmp_path, mode=mode, mcp_servers=mcp_servers, **extra)
    return UvicornThread(create_app(settings), **uvicorn_options(settings))


def _dump(items: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in items]


def _records(tmp_path: Path) -> list[Any]:
    with DiskcacheStore(str(tmp_path / "store")) as store:
        return list(store)


def _session_calls(work: Path) -> list[tuple[str, dict[str, Any]]]:
    """A scripted agent's calls: reads, writes, then the same reads again (their answers change: by order)."""
    count = {"query": "SELECT COUNT(*) AS n FROM notes"}
    return [
        ("get_current_time", {"timezone": "Europe/Paris"}),
        ("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
        ("create_table", {"query": "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)"}),
        ("read_query", count),
        ("write_query", {"query": "INSERT INTO notes (text) VALUES ('first')"}),
        ("read_query", count),
        ("write_query", {"query": "INSERT INTO notes (text) VALUES ('second')"}),
        ("read_query", count),
        ("git_status", {"repo_path": str(work / "repo")}),
        ("git_log", {"repo_path": str(work / "repo"), "max_count": 5}),
    ]


def _node_calls(work: Path) -> list[tuple[str, dict[str, Any]]]:
    graph: list[tuple[str, dict[str, Any]]] = [
        ("read_graph", {}),
        ("create_entities", {"entities": [{"name": "Ada", "entityType": "person", "observations": ["wrote notes"]}]}),
        ("read_graph", {}),
        ("write_file", {"path": str(work / "files" / "a.txt"), "content": "hello"}),
        ("read_text_file", {"path": str(work / "files" / "a.txt")}),
        ("echo", {"message": "hi"}),
    ]
    return graph


def test_a_session_with_real_servers_replays_identically_with_every_server_stopped(tmp_path: Path) -> None:
    work = tmp_path / "work"
    servers.make_git_repo(work / "repo")
    (work / "files").mkdir()
    config = {"time": servers.time_server(), "sqlite": servers.sqlite_server(work / "notes.db"),
              "git": servers.git_server(work / "repo")}
    calls = _session_calls(work)
    try:
        config.update(memory={**servers.node_server("memory"), "env": {"MEMORY_FILE_PATH": str(work / "memory.jsonl")}},
                      filesystem=servers.node_server("filesystem", str(work / "files")), everything=servers.node_server("everything"))
        calls += _node_calls(work)
    except pytest.skip.Exception:
        pass  # the npm servers are not installed here: the PyPI ones alone
    with _serve(tmp_path, "record", config) as server:
        recorded_tools, recorded = servers.run_session(server.url + "/mcp", calls)
        stats = requests.get(server.url + "/stats", timeout=10).json()
        assert servers.children_running(str(work))  # the live servers run while the mirror does
    assert not servers.children_running(str(work))  # stopped with it
    assert not any(r.is_error for r in recorded), [r for r in recorded if r.is_error]
    counts = [r.content[0].text for r, (name, _) in zip(recorded, calls) if name == "read_query"]
    assert counts == ["[{'n': 0}]", "[{'n': 1}]", "[{'n': 2}]"]  # one call, three answers: the state changed between them
    assert stats["by_source"].get("mcp") == len(calls)
    listed = {t.name for t in recorded_tools}
    assert {"get_current_time", "read_query", "git_status"} <= listed
    (work / "notes.db").unlink()  # the state is gone too: only the records answer now
    with _serve(tmp_path, "replay", config) as server:
        replayed_tools, replayed = servers.run_session(server.url + "/mcp", calls)
        assert not servers.children_running(str(work))  # in replay no server is started
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert _dump(replayed_tools) == _dump(recorded_tools)
    assert _dump(replayed) == _dump(recorded)
    assert stats["hits"] == len(calls)
    sources = {r.source for r in _records(tmp_path)}
    assert sources == {"mcp"}


def _echo_server(*args: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [ROGUE, *args]}


def _simulator(text: str) -> OpenAIStub:
    return OpenAIStub(lambda body: Reply(json.dumps({"error": "", "response": text})))


def test_a_server_down_is_simulated_from_its_recorded_schema_or_is_an_error_that_replays(tmp_path: Path) -> None:
    call = [("echo", {"text": "hello"})]
    with _serve(tmp_path, "record", {"rogue": _echo_server()}) as server:  # the listing (and its schema) recorded
        servers.run_session(server.url + "/mcp", [])
    down = {"rogue": {"command": str(tmp_path / "no-such-server")}}
    with _simulator("HELLO from the simulator") as stub:
        with _serve(tmp_path, "record", down, simulator={"enabled": True, "api_base": stub.api_base, "style": "world-model", "max_retries": 0}) as server:
            tools, [simulated] = servers.run_session(server.url + "/mcp", call)
        asked = stub.requests[0]["messages"][1]["content"]
    assert [t.name for t in tools] == ["echo", "big"]  # the recorded listing, the server being down
    assert simulated.content[0].text == "HELLO from the simulator" and not simulated.is_error
    assert '"inputSchema": {"type": "object", "properties": {"text"' in asked and '"hello"' in asked
    [record] = [r for r in _records(tmp_path) if r.api == "@mcp/rogue/echo"]
    assert (record.source, record.meta["server_down"].startswith("MCP server 'rogue' did not start")) == ("simulated", True)

    other = [("echo", {"text": "other"})]
    with _serve(tmp_path, "record", down) as server:  # no simulator: an error result naming the server
        _, [failed] = servers.run_session(server.url + "/mcp", other)
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert failed.is_error and "MCP server 'rogue' did not start" in failed.content[0].text
    assert (stats["failure_records"], stats["by_api"]["@mcp/rogue/echo"]["failed"]) == (1, 1)
    with _serve(tmp_path, "replay", down) as server:  # the failure replays as it was served, and so does the simulation
        _, replayed = servers.run_session(server.url + "/mcp", call + other)
    assert _dump(replayed) == _dump([simulated, failed])


def test_hostile_servers_get_clear_errors_and_nothing_is_written_outside_the_store(tmp_path: Path) -> None:
    config = {
        "hangs": {"command": "sleep", "args": ["120"], "start_timeout_s": 2},
        "garbage": {"command": "sh", "args": ["-c", "head -c 3000000 /dev/zero | tr '\\\\0' g; echo; echo '{not json'; sleep 120"],
                    "start_timeout_s": 2},
        "rogue": {**_echo_server("--tools", "10000", "--odd-names", "--big-bytes", str(50 << 20)), "start_timeout_s": 60},
    }
    before = sorted(p for p in tmp_path.parent.rglob("*") if "store" not in p.parts)
    with _serve(tmp_path, "record", config) as server:
        tools, results = servers.run_session(server.url + "/mcp", [("../../escape", {}), ("a/b\\c", {"x": 1}), ("big", {})])
        health = requests.get(server.url + "/health", timeout=10)
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert health.status_code == 200
    assert len(tools) == 10_000 + 4  # every tool of the server that answered, in pages; none of the two that did not start
    escaped, odd, big = results
    assert not escaped.is_error and json.loads(escaped.content[0].text)["tool"] == "../../escape"
    assert not odd.is_error
    assert big.is_error and "MCP server 'rogue' failed: the server's answer is over 17825792 bytes" in big.content[0].text
    apis = {r.api for r in _records(tmp_path)}
    assert {a for a in apis if not a.endswith("@tools")} == {f"@mcp/rogue/{servers_part}" for servers_part in
                                                            _parts("../../escape", "a/b\\c", "big")}
    assert "@mcp/hangs/@tools" not in apis and "@mcp/garbage/@tools" not in apis
    assert stats["failure_records"] == 1  # the result too large to keep: a failure record naming why
    assert not servers.children_running("sleep 120")  # the servers that never started are stopped
    after = sorted(p for p in tmp_path.parent.rglob("*") if "store" not in p.parts)
    assert [p for p in after if p not in before and "escape" in str(p)] == []


def _parts(*names: str) -> list[str]:
    from stabletoolbench_mirror.responders.mcp_live.tools import name_part

    return [name_part(n) for n in names]


def test_a_snapshot_of_an_mcp_run_replays_it_alone_in_a_clean_folder(tmp_path: Path) -> None:
    import shutil
    import subprocess

    import yaml

    run = tmp_path / "run"
    run.mkdir()
    config = {"time": {**servers.time_server(), "matcher": "exact"}, "sqlite": servers.sqlite_server(run / "notes.db")}
    calls = _session_calls(run)[:8]
    chat = {"model": "agent-model", "messages": [{"role": "user", "content": "which tool next?"}]}
    (run / "mcp.json").write_text(json.dumps({"mcpServers": config}))  # an MCP client's file, as the benchmarks ship theirs
    with _simulator("the agent's answer") as agent:
        (run / "config.yml").write_text(yaml.safe_dump({
            "mode": "record", "store": {"path": str(run / "store")}, "mcp_servers": "mcp.json",
            "llm": {"upstreams": [{"base_url": agent.api_base}]}}))
        settings = make_settings(run, mode="record", mcp_servers=str(run / "mcp.json"), llm={"upstreams": [{"base_url": agent.api_base}]})
        with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
            recorded_tools, recorded = servers.run_session(server.url + "/mcp", calls)
            model_answer = requests.post(server.url + "/v1/chat/completions", json=chat, timeout=30).json()
    cli = [sys.executable, "-m", "stabletoolbench_mirror", "snapshot", str(run / "bundle.tar.gz"), "--config", str(run / "config.yml"), "-q"]
    subprocess.run(cli, check=True, cwd=run, capture_output=True, timeout=120)
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.move(run / "bundle.tar.gz", clean / "bundle.tar.gz")
    shutil.rmtree(run)  # the run's store, database and config are gone: the bundle alone answers
    settings = make_settings(clean, mode="replay", frozen_caches=[str(clean / "bundle.tar.gz")], download_dir=str(clean / "unpacked"),
                             mcp={"enabled": True})
    with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
        replayed_tools, replayed = servers.run_session(server.url + "/mcp", calls)
        replayed_answer = requests.post(server.url + "/v1/chat/completions", json=chat, timeout=30).json()
        stats = requests.get(server.url + "/stats", timeout=10).json()
    assert _dump(replayed_tools) == _dump(recorded_tools)
    assert _dump(replayed) == _dump(recorded)
    assert replayed_answer == model_answer
    assert stats["hits"] == len(calls) and stats["by_source"] == {"frozen": len(calls)}


def test_mcp_verify_names_the_tool_and_field_that_drifted_and_exits_1(tmp_path: Path) -> None:
    import subprocess

    import yaml

    calls = [("echo", {"text": "a", "sent_at": "2026-01-01T00:00:00"}), ("echo", {"text": "b", "sent_at": "2026-01-01T00:00:01"})]
    config = {"rogue": {**_echo_server(), "ignore_fields": ["sent_at"]}}
    with _serve(tmp_path, "record", config) as server:
        servers.run_session(server.url + "/mcp", calls)

    def verify(version: int) -> subprocess.CompletedProcess[str]:
        cfg = {"rogue": {**_echo_server("--version", str(version)), "ignore_fields": ["sent_at"]}}
        (tmp_path / "verify.yml").write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "store")}, "mcp_servers": cfg}))
        return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "mcp-verify", "--config", str(tmp_path / "verify.yml"), "--json"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    same = verify(1)
    assert same.returncode == 0, same.stdout + same.stderr
    report = json.loads(same.stdout)
    assert (report["drifted"], report["servers"][0]["calls"]) == (False, 2)
    changed = verify(2)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    [drift] = json.loads(changed.stdout)["servers"]
    assert drift["schema"] == {"echo": ["inputSchema.properties.loud", "inputSchema.required"]}  # the tool and its fields
    assert drift["answers"] == {"echo": ["content[0].text.version"]} and drift["differing"] == 2
    kept = sorted((r for r in _records(tmp_path) if r.api == "@mcp/rogue/@drift"), key=lambda r: r.answer["at"])
    assert [(r.answer["seen"], r.answer["drifted"]) for r in kept] == [("verify", False), ("verify", True)]  # the changelog
    assert kept[1].answer["schema"] == drift["schema"]
    with _serve(tmp_path, "record", {"rogue": _echo_server("--version", "2")}) as server:  # a record run sees the new schema
        servers.run_session(server.url + "/mcp", [])
    [seen] = [r for r in _records(tmp_path) if r.api == "@mcp/rogue/@drift" and r.answer["seen"] == "record"]
    assert seen.answer["schema"] == {"echo": ["inputSchema.properties.loud", "inputSchema.required"]}
    report = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "report", "--store-path", str(tmp_path / "store"), "--json"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    rogue = json.loads(report.stdout)["mcp"]["servers"]["rogue"]  # the run's report: its calls and its changelog
    assert (rogue["calls"], rogue["calls_by_source"]["mcp"], rogue["tools_called"]) == (2, 2, 1)
    assert [(d["seen"], d["drifted"]) for d in rogue["drift"]] == [("verify", False), ("verify", True), ("record", True)]
    assert rogue["last_verified"]["drifted"] is True and rogue["drifted"] is True


def _raw_call(url: str, tool: str, arguments: dict[str, Any]) -> Any:
    """One ``tools/call`` in a handshake-era session, as plain JSON-RPC over HTTP: the reply itself."""
    headers = {"accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
    opened = requests.post(url, json=init, headers=headers, timeout=30)
    headers["mcp-session-id"] = opened.headers["mcp-session-id"]
    requests.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers, timeout=30)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return requests.post(url, json=call, headers=headers, timeout=30)


def test_a_handshake_era_session_is_recorded_and_replayed_in_order_through_the_direct_path(tmp_path: Path) -> None:
    """A client with an MCP session (the handshake era) has its live calls answered without the SDK's session
    machinery (serving.mcp_live_front.answer_directly): the same results, by order, as the SDK path gives."""
    work = tmp_path / "work"
    work.mkdir()
    config = {"sqlite": servers.sqlite_server(work / "notes.db"), "rogue": _echo_server()}
    calls = _session_calls(work)[2:8] + [("echo", {"text": "é ✓"}), ("no_such_tool", {})]
    with _serve(tmp_path, "record", config) as server:
        tools, recorded = servers.run_session(server.url + "/mcp", calls, mode="legacy")
        stats = requests.get(server.url + "/stats", timeout=10).json()
    counts = [r.content[0].text for r, (name, _) in zip(recorded, calls) if name == "read_query"]
    assert counts == ["[{'n': 0}]", "[{'n': 1}]", "[{'n': 2}]"]
    assert json.loads(recorded[6].content[0].text)["arguments"] == {"text": "é ✓"}
    assert recorded[7].is_error and "No such function name: no_such_tool" in recorded[7].content[0].text  # the SDK path's answer
    assert stats["by_source"] == {"mcp": 7}
    (work / "notes.db").unlink()
    with _serve(tmp_path, "replay", config) as server:
        replayed_tools, replayed = servers.run_session(server.url + "/mcp", calls, mode="legacy")
        _, modern = servers.run_session(server.url + "/mcp", calls)  # the 2026 era: the SDK's path, a run of its own
        direct = _raw_call(server.url + "/mcp", "echo", {"text": "é ✓"})
    assert direct.headers["content-type"] == "application/json"  # answered directly, not as the SDK's event stream
    assert direct.json()["result"]["content"] == _dump([recorded[6]])[0]["content"]
    assert _dump(replayed_tools) == _dump(tools)
    assert _dump(replayed) == _dump(recorded)
    assert [(r.content, r.is_error) for r in modern] == [(r.content, r.is_error) for r in recorded]


def test_seeded_faults_are_served_on_live_mcp_calls_the_same_in_every_run_and_never_recorded(tmp_path: Path) -> None:
    calls = [("echo", {"text": f"call {i}"}) for i in range(12)]
    with _serve(tmp_path, "record", {"rogue": _echo_server()}) as server:
        _, clean = servers.run_session(server.url + "/mcp", calls)
    before = {(r.api, r.key): r.body for r in _records(tmp_path)}
    faults = {"seed": 7, "rate": 0.5, "kinds": ["api_not_working", "truncated", "empty"]}
    runs = []
    for _ in range(2):
        with _serve(tmp_path, "replay", {"rogue": _echo_server()}, faults=faults) as server:
            _, served = servers.run_session(server.url + "/mcp", calls)
            stats = requests.get(server.url + "/stats", timeout=10).json()
        runs.append((_dump(served), stats["faults"]))
    assert runs[0] == runs[1]  # the same calls faulted the same way in every run
    served, counted = runs[0]
    faulted = [i for i, (a, b) in enumerate(zip(served, _dump(clean))) if a != b]
    assert 0 < len(faulted) < len(calls) and sum(counted.values()) == len(faulted)
    kinds = set()
    for i in faulted:
        result, text = served[i], clean[i].content[0].text
        if result.get("isError"):
            kinds.add("api_not_working")
            assert result["content"][0]["text"] == "API not working error..."  # StableToolBench's own error text
        elif not result["content"]:
            kinds.add("empty")
        else:
            kinds.add("truncated")
            assert result["content"][0]["text"] == text[: len(text) // 2]
    assert kinds == set(counted)
    assert {(r.api, r.key): r.body for r in _records(tmp_path)} == before  # served only: the records are the clean results


def test_the_stdio_mcp_command_records_and_replays_live_servers_as_serve_does(tmp_path: Path) -> None:
    """``stabletoolbench-mirror mcp`` (stdio, as an MCP client starts its servers) with ``mcp_servers``: the live servers'
    tools, a stateful session recorded by order, then replayed with the servers gone."""
    import yaml
    from mcp import StdioServerParameters

    work = tmp_path / "work"
    work.mkdir()
    calls = _session_calls(work)[2:8] + [("echo", {"text": "over stdio"})]
    config = {"sqlite": servers.sqlite_server(work / "notes.db"), "rogue": _echo_server()}

    def stdio(mode: str) -> StdioServerParameters:
        path = tmp_path / f"{mode}.yml"
        path.write_text(yaml.safe_dump({"mode": mode, "store": {"path": str(tmp_path / "store")}, "mcp_servers": config}))
        args = ["-m", "stabletoolbench_mirror", "mcp", "--config", str(path)]
        return StdioServerParameters(command=sys.executable, args=args, env={"PYTHONPATH": str(REPO)}, cwd=str(tmp_path))

    tools, recorded = servers.run_session(stdio("record"), calls)
    assert {"read_query", "echo"} <= {t.name for t in tools}
    counts = [r.content[0].text for r, (name, _) in zip(recorded, calls) if name == "read_query"]
    assert counts == ["[{'n': 0}]", "[{'n': 1}]", "[{'n': 2}]"]
    assert {r.source for r in _records(tmp_path)} == {"mcp"}
    (work / "notes.db").unlink()
    config["sqlite"] = {"command": str(tmp_path / "gone")}  # the live servers cannot start now: the records answer
    config["rogue"] = {"command": str(tmp_path / "gone")}
    replayed_tools, replayed = servers.run_session(stdio("replay"), calls)
    assert _dump(replayed_tools) == _dump(tools)
    assert _dump(replayed) == _dump(recorded)


def test_an_agent_frameworks_client_records_and_replays_a_stateful_session(tmp_path: Path) -> None:
    """FastMCP's ``Client`` (an agent framework's, in a venv of its own), not the SDK's: the same session recorded
    with the live servers, then replayed with them gone, lists the same tools and gets the same results, in order."""
    work = tmp_path / "work"
    work.mkdir()
    calls = _session_calls(work)[2:8] + [("echo", {"text": "from FastMCP"})]
    config = {"sqlite": servers.sqlite_server(work / "notes.db"), "rogue": _echo_server()}
    with _serve(tmp_path, "record", config) as server:
        recorded = servers.fastmcp_session(server.url + "/mcp", calls, tmp_path)
    counts = [r["content"][0]["text"] for r, (name, _) in zip(recorded["results"], calls) if name == "read_query"]
    assert counts == ["[{'n': 0}]", "[{'n': 1}]", "[{'n': 2}]"]
    assert {"read_query", "echo"} <= {t["name"] for t in recorded["tools"]}
    (work / "notes.db").unlink()
    gone = {name: {"command": str(tmp_path / "gone")} for name in config}
    with _serve(tmp_path, "replay", gone) as server:
        replayed = servers.fastmcp_session(server.url + "/mcp", calls, tmp_path)
    assert replayed == recorded
