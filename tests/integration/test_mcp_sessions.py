"""Open MCP sessions are bounded per client and in all: a client flooding ``initialize`` closes only its own
idle sessions, and every other client (and a new one of its own) still gets one.  A real server process on
127.0.0.1, raw HTTP for the flood, the official SDK's client for the others."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from tests.helpers.crowd import rss_mb  # noqa: E402
from tests.helpers.processes import ServeProcess  # noqa: E402

INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}}})
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _tools_folder(root: Path) -> Path:
    tools = root / "tools" / "Data"
    tools.mkdir(parents=True)
    doc = {"tool_name": "Echo Tool", "tool_description": "", "api_list": [
        {"name": "echo", "description": "", "method": "GET", "required_parameters": [], "optional_parameters": []}]}
    (tools / "echo_tool.json").write_text(json.dumps(doc), encoding="utf-8")
    return root / "tools"


def _flood(port: int, count: int, source: str = "127.0.0.1") -> tuple[int, int, list[str]]:
    """``count`` initialize requests, never closed, over kept-alive connections: (answered 200, refused 503, the session ids)."""
    def some(n: int) -> tuple[int, int, list[str]]:
        ok = refused = 0
        ids = []
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
        for _ in range(n):
            conn.request("POST", "/mcp", INIT, HEADERS)
            reply = conn.getresponse()
            reply.read()
            ok += reply.status == 200
            refused += reply.status == 503
            if reply.getheader("mcp-session-id"):
                ids.append(reply.getheader("mcp-session-id"))
        conn.close()
        return ok, refused, ids

    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(some, [count // 4] * 4))
    return sum(p[0] for p in parts), sum(p[1] for p in parts), [i for p in parts for i in p[2]]


async def _list_and_call(url: str, source: str) -> tuple[list[str], str]:
    client = httpx2.AsyncClient(timeout=60, transport=httpx2.AsyncHTTPTransport(local_address=source))
    async with Client(streamable_http_client(url, http_client=client)) as mcp:
        tools = (await mcp.list_tools()).tools
        result = await mcp.call_tool(tools[0].name, {})
    return [t.name for t in tools], result.content[0].text


def _serve(tmp_path: Path, **mcp: Any) -> ServeProcess:
    config = {"mode": "replay", "store": {"path": str(tmp_path / "store")}, "tools_folder": str(_tools_folder(tmp_path)),
              "mcp": {"enabled": True, **mcp}}
    return ServeProcess(tmp_path, config)


def test_after_a_flood_of_10000_initializes_other_clients_and_a_new_one_of_its_own_get_a_session(tmp_path: Path) -> None:
    with _serve(tmp_path) as server:  # the defaults: 256 sessions per client, 2,048 in all
        _flood(server.port, 400)  # the allocator and the SDK warmed, and the client at its 256
        baseline = rss_mb(server.pid)
        ok, refused, ids = _flood(server.port, 10_000)
        after = rss_mb(server.pid)
        # every initialize was answered: the flooding client's own oldest idle sessions made room
        assert (ok, refused) == (10_000, 0)
        # another client, and a new one at the flooding address, each initialize, list the tools and call one
        for source in ("127.0.0.2", "127.0.0.1"):
            names, text = asyncio.run(_list_and_call(server.url + "/mcp", source))
            assert names == ["echo_for_echo_tool"] and "error" in json.loads(text)
        # the flood's oldest sessions are closed (their id answers 404), its newest still open
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        ping = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        statuses = []
        for sid in (ids[0], ids[-1]):
            conn.request("POST", "/mcp", ping, {**HEADERS, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"})
            reply = conn.getresponse()
            reply.read()
            statuses.append(reply.status)
        assert statuses == [404, 200]
    # memory: bounded by the sessions kept (256 of this client), not by the 10,000 opened (main: +375 MB)
    assert after - baseline < 60, f"RSS {baseline:.0f} MB -> {after:.0f} MB over 10,000 initializes"


def test_sessions_are_bounded_in_all_and_the_client_holding_the_most_gives_one_up(tmp_path: Path) -> None:
    with _serve(tmp_path, max_sessions=20, max_sessions_per_client=15) as server:
        assert _flood(server.port, 40, "127.0.0.1")[:2] == (40, 0)  # 15 kept: its own oldest closed
        assert _flood(server.port, 8, "127.0.0.3")[:2] == (8, 0)  # 20 in all: 127.0.0.1 (15) gave up 3
        names, _ = asyncio.run(_list_and_call(server.url + "/mcp", "127.0.0.2"))
        assert names == ["echo_for_echo_tool"]


def _initialize(port: int, source: str) -> tuple[int, str, str | None]:
    """One ``initialize`` from ``source``: (status, body, its session id)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    try:
        conn.request("POST", "/mcp", INIT, HEADERS)
        reply = conn.getresponse()
        return reply.status, reply.read().decode(), reply.getheader("mcp-session-id")
    finally:
        conn.close()


def _hold_busy(port: int, source: str, sid: str) -> socket.socket:
    """A request of session ``sid`` in flight: its headers sent, its body withheld (the session is busy until it closes)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0))
    sock.sendall((f"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                  f"Mcp-Session-Id: {sid}\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: 1000\r\n\r\n").encode())
    return sock


def _refused_while_held(port: int, holders: list[str], newcomer: str) -> tuple[str, list[socket.socket]]:
    """Sessions of ``holders`` opened and each kept busy, then ``newcomer``'s ``initialize``: its 503 body, and the held sockets.

    A held request reaches the server in its own time, and a session is counted as open only once the server's
    ``initialize`` handler has returned, which may be a moment after its client read the answer (a request of the
    session before that is not seen as keeping it busy); a newcomer let in before the holders were busy closes an
    idle session, so the round is tried again, the holders given longer each time (up to about 45 s in all).
    """
    for wait_s in (0.2, 0.5, 1, 2, 4, 8, 16):
        held = []
        for source in holders:
            status, _, sid = _initialize(port, source)
            assert status == 200 and sid
            time.sleep(wait_s / 2)
            held.append(_hold_busy(port, source, sid))
        time.sleep(wait_s)
        status, body, _ = _initialize(port, newcomer)
        if status == 503:
            return body, held
        for sock in held:
            sock.close()
    raise AssertionError(f"never refused: {status} {body}")


@pytest.mark.parametrize("key", ["mcp.max_sessions", "mcp.max_sessions_per_client"])
def test_with_no_session_idle_a_new_one_is_refused_with_503_naming_the_key(tmp_path: Path, key: str) -> None:
    limits = {"max_sessions": 2, "max_sessions_per_client": 5} if key == "mcp.max_sessions" else {"max_sessions_per_client": 2}
    holders = ["127.0.0.1", "127.0.0.3"] if key == "mcp.max_sessions" else ["127.0.0.1", "127.0.0.1"]
    newcomer = "127.0.0.2" if key == "mcp.max_sessions" else "127.0.0.1"
    with _serve(tmp_path, **limits) as server:
        body, held = _refused_while_held(server.port, holders, newcomer)
        try:
            assert f"the server's {key} setting bounds this" in body and "none idle" in body and "MCP DELETE" in body, body
        finally:
            for sock in held:
                sock.close()
        # the held requests ended: their sessions are idle again, and one of them makes room
        deadline = time.monotonic() + 30
        while (status := _initialize(server.port, newcomer)[0]) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == 200
        names, _ = asyncio.run(_list_and_call(server.url + "/mcp", newcomer))
        assert names == ["echo_for_echo_tool"]
