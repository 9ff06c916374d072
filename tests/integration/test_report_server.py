"""``report http://HOST:PORT``: a server's ``/stats`` read under one deadline and a size bound, checked, and its model calls.

Hostile servers are real sockets on 127.0.0.1 scripted byte by byte: one that trickles its body (or its
headers) a byte at a time, never slow enough to trip a per-read timeout; one that sends 300 MB; ones
that answer something that is not a ``/stats``.  ``--timeout`` is the deadline of the whole fetch and
``--max-mb`` what may be read: each ends in a clear error with exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.serving.server import create_app
from tests.helpers.live import UvicornThread
from tests.helpers.model_stubs import ToolLlamaStub
from tests.helpers.openai_stub import OpenAIStub
from tests.helpers.paths import REPO

STATS = {"requests": 0, "by_api": {}, "by_source": {}}
TOOLLLAMA = "ToolBench/ToolLLaMA-2-7b-v2"
HEALTH = {"status": "ok", "responders": [], "simulator_prompt": None, "mode": "replay", "version": "test"}


def cli(*args: str, cwd: Path, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - started


def answer(status: int, body: bytes, *, length: bool = True, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nConnection: close\r\n"
    if length:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


Behaviour = Callable[[socket.socket, str], None]


class Scripted:
    """A raw HTTP/1.1 server on 127.0.0.1: each request's path goes to ``behaviour(sock, path)``."""

    def __init__(self, behaviour: Behaviour) -> None:
        outer = self
        self.behaviour = behaviour
        self.stop = threading.Event()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                path = data.split(b" ", 2)[1].decode()
                try:
                    outer.behaviour(self.request, path)
                except OSError:  # the client went away: what a refusal does
                    pass

        socketserver.ThreadingTCPServer.daemon_threads = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Scripted:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def json_routes(stats: Any, health: Any = HEALTH) -> Behaviour:
    def behaviour(sock: socket.socket, path: str) -> None:
        sock.sendall(answer(200, json.dumps(stats if path == "/stats" else health).encode()))
    return behaviour


@pytest.fixture
def scripted() -> Iterator[Callable[[Behaviour], Scripted]]:
    started: list[Scripted] = []

    def start(behaviour: Behaviour) -> Scripted:
        server = Scripted(behaviour).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


# -- one deadline for the whole fetch ------------------------------------------------------------------------


def test_a_body_trickled_a_byte_at_a_time_ends_at_the_deadline(scripted: Any, tmp_path: Path) -> None:
    def trickle(sock: socket.socket, path: str) -> None:
        body = json.dumps(STATS).encode() + b" " * 100_000
        sock.sendall(answer(200, b"", length=False)[:-2] + f"Content-Length: {len(body)}\r\n\r\n".encode())
        for byte in body:  # 5 bytes a second: each read gets something long before any per-read timeout
            sock.sendall(bytes([byte]))
            time.sleep(0.2)

    server = scripted(trickle)
    done, seconds = cli("report", server.url, "--json", "--timeout", "3", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert f"{server.url}/stats: no whole answer within --timeout 3 s" in done.stderr and "Traceback" not in done.stderr
    assert seconds < 60  # the deadline, not the body's 5.5 hours (or a per-read timeout that never trips)


def test_headers_trickled_a_byte_at_a_time_end_at_the_deadline_too(scripted: Any, tmp_path: Path) -> None:
    def trickle(sock: socket.socket, path: str) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
            sock.sendall(bytes([byte]))
            time.sleep(0.2)

    server = scripted(trickle)
    done, seconds = cli("report", server.url, "--json", "--timeout", "3", cwd=tmp_path)
    assert done.returncode == 2 and "no whole answer within --timeout 3 s" in done.stderr
    assert seconds < 60


def test_the_deadline_covers_stats_and_health_together(scripted: Any, tmp_path: Path) -> None:
    def slow_each(sock: socket.socket, path: str) -> None:  # each answer takes 2 s: both together, 4 s
        time.sleep(2)
        sock.sendall(answer(200, json.dumps(STATS if path == "/stats" else HEALTH).encode()))

    server = scripted(slow_each)
    done, _ = cli("report", server.url, "--json", "--timeout", "3", cwd=tmp_path)
    assert done.returncode == 2 and f"{server.url}/health: no whole answer within --timeout 3 s" in done.stderr
    done, _ = cli("report", server.url, "--json", "--timeout", "20", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"]["requests"] == 0


# -- a bound on what is read --------------------------------------------------------------------------------

#: the command, then its peak resident memory: VmHWM, this process's own since its exec (ru_maxrss would carry the
#: forking parent's, pytest's, over the exec)
MEASURED = """
import re, sys
from stabletoolbench_mirror.commands.cli import main
status = main(sys.argv[1:])
with open("/proc/self/status") as status_file:
    print("peak_kib", re.search(r"VmHWM:\\s+(\\d+) kB", status_file.read()).group(1), file=sys.stderr)
sys.exit(status)
"""


def huge(announce: bool) -> Behaviour:
    total = 300 << 20

    def behaviour(sock: socket.socket, path: str) -> None:
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        head += f"Content-Length: {total + 2}\r\n\r\n" if announce else "\r\n"
        sock.sendall(head.encode() + b"[")
        chunk = b"0," * (1 << 19)
        for _ in range(total // len(chunk)):
            sock.sendall(chunk)
        sock.sendall(b"0]")

    return behaviour


@pytest.mark.parametrize("announce", [False, True], ids=["streamed", "announced"])
def test_a_300_mb_stats_is_refused_past_max_mb_and_costs_no_more_than_that(scripted: Any, tmp_path: Path, announce: bool) -> None:
    server = scripted(huge(announce))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", MEASURED, "report", server.url, "--json", "--max-mb", "8", "--timeout", "60"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert f"{server.url}/stats: the answer is over 8 MiB" in done.stderr and "raise --max-mb" in done.stderr
    peak_mib = int(done.stderr.rsplit("peak_kib ", 1)[1].split()[0]) / 1024
    print(f"peak resident memory: {peak_mib:.0f} MiB")
    assert peak_mib < 250, peak_mib  # the interpreter and the package, and 8 MiB: never the 300 MB sent


# -- what is not a /stats --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("stats", "health", "says"), [
    ({"requests": "many", "by_api": {}}, HEALTH, "/stats: not a stabletoolbench-mirror stats answer: requests: Input should be a valid integer"),
    ({"requests": 3, "by_api": []}, HEALTH, "by_api: Input should be a valid dictionary"),
    ({"requests": 3, "by_api": {"A/b_for_A/c": {"hits": -1}}}, HEALTH, "by_api.A/b_for_A/c.hits: Input should be greater than or equal to 0"),
    ({"requests": 3, "by_api": {}, "model_calls": {"gpt": {"requests": True}}}, HEALTH, "model_calls.gpt.requests: Input should be a valid integer"),
    ([1, 2, 3], HEALTH, "/stats: not a stabletoolbench-mirror stats answer: (the whole answer): Input should be a valid dictionary"),
    ({"status": "ok"}, HEALTH, "requests: Field required"),
    (STATS, {"responders": "simulated"}, "/health: not a stabletoolbench-mirror health answer: responders: Input should be a valid list"),
], ids=["text-count", "list-by-api", "negative", "bool-count", "a-list", "another-server", "bad-health"])
def test_an_answer_that_is_not_a_stats_is_a_clear_error_with_exit_2(scripted: Any, tmp_path: Path, stats: Any, health: Any,
                                                                      says: str) -> None:
    server = scripted(json_routes(stats, health))
    done, _ = cli("report", server.url, "--json", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(("body", "says"), [
    (b'{"requests": 1', "/stats: not JSON"),
    (b"<html>a proxy's error page</html>", "/stats: not JSON"),
    (b"[" * 200_000 + b"]" * 200_000, "/stats: not JSON"),
    (b"\xff\xfe\x00garbage", "/stats: not JSON"),
], ids=["cut", "html", "deep", "bytes"])
def test_a_body_that_is_not_json_is_a_clear_error_with_exit_2(scripted: Any, tmp_path: Path, body: bytes, says: str) -> None:
    server = scripted(lambda sock, path: sock.sendall(answer(200, body)))
    done, _ = cli("report", server.url, "--json", cwd=tmp_path)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_status_other_than_200_is_named(scripted: Any, tmp_path: Path) -> None:
    server = scripted(lambda sock, path: sock.sendall(answer(401, b'{"error": "token"}')))
    done, _ = cli("report", server.url, "--json", cwd=tmp_path)
    assert done.returncode == 2 and f"{server.url}/stats: HTTP 401 (the server wants a token" in done.stderr


# -- a real server: model calls are not tool calls --------------------------------------------------------------


def test_a_servers_model_calls_are_a_section_of_their_own_never_in_the_tool_figures(tmp_path: Path) -> None:
    with OpenAIStub() as simulator, OpenAIStub(model="gpt-judge") as judge, ToolLlamaStub() as toolllama:
        upstreams = [{"base_url": toolllama.api_base, "models": ["ToolBench/*"]}, {"base_url": judge.api_base}]
        settings = Settings(mode="record", store={"path": str(tmp_path / "store")}, log_level="warning",
                            tools_folder=str(REPO / "cache" / "tools"),
                            simulator={"enabled": True, "api_base": simulator.api_base, "model": "MirrorAPI", "max_retries": 0},
                            llm={"upstreams": upstreams})
        with UvicornThread(create_app(settings)) as server, requests.Session() as http:
            for city in ("Lyon", "Oslo"):
                payload = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather",
                           "tool_input": json.dumps({"city": city}), "strip": "truncate", "toolbench_key": ""}
                assert http.post(server.url + "/virtual", json=payload, timeout=30).headers["X-STM-Outcome"] == "recorded"
            body = {"model": "gpt-judge", "messages": [{"role": "user", "content": "judge"}], "temperature": 0.2}
            for _ in range(3):
                assert http.post(server.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
            text = {"model": TOOLLLAMA, "prompt": "System: you are ToolLLaMA\nUser: hello\nAssistant:\n", "temperature": 0}
            assert http.post(server.url + "/v1/completions", json=text, timeout=30).status_code == 200
            done, _ = cli("report", server.url, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    requests_ = report["requests"]
    assert requests_["requests"] == 2 and requests_["answered"]["simulated"] == 2 and requests_["simulated_share"] == 1.0
    assert not any(name.startswith("@model") or name == "gpt-judge" for name in [*requests_["by_category"], *requests_["by_tool"]])
    rows = {row["model"]: row for row in report["models"]["models"]}
    assert set(rows) == {"gpt-judge", TOOLLLAMA}
    # three calls, each one asked upstream (the stub counts one prompt and one completion token per answer)
    row = rows["gpt-judge"]
    assert row["calls"] == 3 and row["prompt_tokens"] == 3 and row["completion_tokens"] == 3
    assert row["outcomes"]["recorded"] == 3 and row["outcomes"]["upstream_calls"] == 3 and row["distinct_requests"] is None
    assert rows[TOOLLLAMA]["calls"] == 1
    # the store they were recorded in: each endpoint a row of its own, its calls and distinct requests
    done, _ = cli("report", str(tmp_path / "store"), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    stored = json.loads(done.stdout)
    assert stored["records"]["entries"] == 2 and stored["records"]["simulated"]["share"] == 1.0
    assert sorted((r["model"], r["endpoint"], r["calls"], r["distinct_requests"]) for r in stored["models"]["models"]) == [
        (TOOLLLAMA, "completions", 1, 1), ("gpt-judge", "chat_completions", 3, 1)]
