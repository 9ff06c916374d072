"""Blocking work is shared fairly between clients (issue 18, item 4): a client under its limit is served
within seconds whatever others queue.  A crowd of 199 loopback addresses with 8 slow misses each against a real
``serve`` process and a slow simulator on 127.0.0.1 (the turns themselves: tests/unit/core/test_fair.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.core.fair import CLIENT, FairLimiter
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.serving.server import create_app
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache
from tests.helpers.crowd import close_all, crowd_of_requests
from tests.helpers.processes import ServeProcess, StubProcess

# -- a crowd over real sockets -------------------------------------------------------------------

TOOLS_FILE = """\
def recall(tool_input, state):
    state["n"] = state.get("n", 0) + 1
    return {"calls": state["n"]}

TOOLS = {"Tools/Notes/Recall": recall}
"""


def _payload(category: str, tool: str, api: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"category": category, "tool_name": tool, "api_name": api, "tool_input": json.dumps(tool_input),
            "strip": "", "toolbench_key": ""}


def _timed(fn: Any) -> tuple[requests.Response, float]:
    start = time.monotonic()
    r = fn()
    return r, time.monotonic() - start


def test_a_client_under_its_limit_is_served_within_seconds_beside_a_199_address_crowd(tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS_FILE)
    frozen = tmp_path / "frozen" / "Data" / "cold_for_Data"
    frozen.mkdir(parents=True)
    (frozen / "hit.json").write_text(json.dumps({"{'q': 'x'}": {"error": "", "response": "frozen answer"}}))
    latency_s = 2.0
    with StubProcess(tmp_path, latency_ms=latency_s * 1000, echo_prompt=False) as stub:
        config = {"mode": "record", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
                  "frozen_caches": [str(tmp_path / "frozen")], "local_tools": [str(tools)],
                  "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "allow_without_docs": True}}
        with ServeProcess(tmp_path, config) as server:  # default limits: 8 a client is well within them
            crowd = {f"127.0.0.{i}": [json.dumps(_payload("Data", "Crowd Tool", "slow", {"who": i, "n": n})).encode()
                                      for n in range(8)] for i in range(2, 201)}
            t_crowd = time.monotonic()
            socks = crowd_of_requests(server.port, crowd)
            t_crowd = time.monotonic() - t_crowd
            try:
                time.sleep(2 * latency_s)  # the crowd's queue is built up: 1,592 misses, 64 at a time
                url = server.url + "/virtual"
                local, t_local = _timed(lambda: requests.post(url, json=_payload("Tools", "Notes", "Recall", {}), timeout=120))
                sid = requests.post(server.url + "/sessions", json={}, timeout=120).json()["id"]
                session, t_session = _timed(lambda: requests.post(
                    url, json=_payload("Tools", "Notes", "Recall", {}), headers={"X-STM-Session": sid}, timeout=120))
                hit, t_hit = _timed(lambda: requests.post(url, json=_payload("Data", "cold", "hit", {"q": "x"}), timeout=120))
                miss, t_miss = _timed(lambda: requests.post(url, json=_payload("Data", "Own Tool", "mine", {"q": 1}), timeout=120))
                stats = requests.get(server.url + "/stats", timeout=120).json()
            finally:
                close_all(socks)
                t_close = time.monotonic()
                os.killpg(server.pid, signal.SIGKILL)  # not a graceful stop: 1,000 misses still wait
        t_close = time.monotonic() - t_close
    print(f"closed in {t_close:.1f} s")
    assert local.json() == {"error": "", "response": '{"calls": 1}'} and local.headers["x-stm-outcome"] == "local"
    assert session.json() == {"error": "", "response": '{"calls": 1}'}
    assert hit.json() == {"error": "", "response": "frozen answer"} and hit.headers["x-stm-outcome"] == "hit"
    assert miss.status_code == 200 and miss.headers["x-stm-outcome"] == "recorded"
    print(f"crowd sent in {t_crowd:.1f} s; answered {stats['requests']}")
    times = f"local {t_local:.2f} s, session {t_session:.2f} s, frozen {t_hit:.2f} s, miss {t_miss:.2f} s"
    assert t_local < 2 and t_session < 2 and t_hit < 2, times
    assert t_miss < 5, times
    assert stats["requests"] < 800, f"the crowd was not queued any more ({stats['requests']} answered)"
    print(times)


def test_miss_turns_go_to_the_client_holding_none_before_another_clients_queue(tmp_path: Path, serve, settings_factory) -> None:
    """limits.max_pending_misses turns: 127.0.0.2 queues 12 misses behind its 2 turns; 127.0.0.3's one miss
    takes the next free turn (first come, first served it would wait for all 12)."""
    from stabletoolbench_mirror.engine.layer import MirrorLayer
    from stabletoolbench_mirror.stores import DiskcacheStore
    from tests.helpers.responders import KeyedResponder

    settings = settings_factory(limits={"max_pending_misses": 2, "max_in_flight_per_client": 100})
    responder = KeyedResponder(delay_s=0.4)
    server = serve(settings, MirrorLayer(DiskcacheStore(tmp_path / "s"), responders=[responder], max_pending_misses=2))
    port = int(server.url.rsplit(":", 1)[1])
    crowd = {"127.0.0.2": [json.dumps(_payload("Data", "Turn Tool", "slow", {"n": n})).encode() for n in range(14)]}
    socks = crowd_of_requests(port, crowd)
    try:
        time.sleep(0.2)
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.3", 0)) as sock:
            body = json.dumps(_payload("Data", "Turn Tool", "mine", {"n": 1})).encode()
            sock.sendall(f"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = sock.recv(65536)
        elapsed = time.monotonic() - start
    finally:
        close_all(socks)
    assert answer.startswith(b"HTTP/1.1 200") and b"x-stm-outcome: recorded" in answer
    assert elapsed < 1.2, f"a miss of another client waited {elapsed:.2f} s behind 12 queued misses (0.4 s each, 2 at a time)"
    assert responder.max_active == 2


def test_a_frozen_files_first_parse_takes_a_fair_turn_of_the_servers_threads(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "Tools" / "t_for_Tools"
    tree.mkdir(parents=True)
    (tree / "a.json").write_text(json.dumps({"{'q': 1}": {"error": "", "response": "parsed"}}))
    frozen = FrozenCache(str(tmp_path / "tree"))
    limiter = FairLimiter(1)
    frozen.use_threads(limiter)

    async def main() -> tuple[bool, str]:
        held, release = asyncio.Event(), asyncio.Event()

        async def crowd() -> None:
            CLIENT.set("crowd")
            async with limiter:  # the only turn, held by another client's work
                held.set()
                await release.wait()

        async def parse() -> str:
            CLIENT.set("127.0.0.1")
            record = await frozen.aget("Tools/t_for_Tools/a", "{'q': 1}")
            assert record is not None
            return record.answer["response"]

        holder = asyncio.create_task(crowd())
        await held.wait()
        load = asyncio.create_task(parse())
        deadline = time.monotonic() + 10
        while sum(map(len, limiter._turns.waiting.values())) != 1 and not load.done() and time.monotonic() < deadline:  # noqa: SLF001 - its queues
            await asyncio.sleep(0.005)
        waited = not load.done() and sum(map(len, limiter._turns.waiting.values())) == 1  # noqa: SLF001 - the parse waits for a turn of the limiter
        release.set()
        await holder
        return waited, await asyncio.wait_for(load, 10)

    waited, answer = asyncio.run(main())
    assert waited and answer == "parsed"


def test_the_server_hands_its_fair_threads_to_the_frozen_tiers(tmp_path: Path, settings_factory) -> None:
    (tmp_path / "tree").mkdir()
    layer = MirrorLayer(DiskcacheStore(tmp_path / "store"), frozen=[FrozenCache(str(tmp_path / "tree"))])
    create_app(settings_factory(), layer)
    assert isinstance(layer.frozen[0]._threads, FairLimiter)  # noqa: SLF001 - which limiter the frozen loads wait on
