"""The hit path's shortcuts (issue 24) keep every answer as it was.

* a body seen before skips its parse, but its answer is still looked up each time: a record the
  store gains, or a frozen file rewritten, is served to the very same bytes at once;
* the kept calls are bounded (count and body size);
* the lone-surrogate check done on all string fields at once still names the field;
* the counters of plain requests (counted through kept increments) add up as before;
* ``benchmarks/ceiling.py`` refuses to run without wrk, naming the package.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.protocol import VirtualRequest
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.factory import build_store
from stabletoolbench_mirror.serving import prepared, uvicorn_protocol
from stabletoolbench_mirror.serving.prepared import PreparedCalls
from stabletoolbench_mirror.serving.server import GuardedHttpProtocol, create_app, uvicorn_options
from tests.helpers.live import UvicornThread
from tests.helpers.paths import REPO

API = "Tools/t_for_Tools/a"


def body(tool_input: dict, **extra: str) -> bytes:
    return json.dumps({"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": json.dumps(tool_input),
                       "strip": "", "toolbench_key": "", **extra}).encode()


def post(server, data: bytes) -> requests.Response:
    return requests.post(server.url + "/virtual", data=data, headers={"Content-Type": "application/json"}, timeout=30)


def test_a_body_seen_before_is_still_looked_up_each_time(serve, settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    path = tree.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "frozen before"}}))
    settings = settings_factory(mode="replay", frozen_caches=[str(tree)])
    server = serve(settings)
    first, second = body({"a": 1}), body({"a": 2})
    a, b = post(server, first), post(server, first)
    assert (a.status_code, a.content, a.headers["x-stm-outcome"]) == (200, b.content, "hit")
    assert sorted((k, v) for k, v in a.headers.items() if k.lower() != "date") == \
        sorted((k, v) for k, v in b.headers.items() if k.lower() != "date")
    assert post(server, second).headers["x-stm-outcome"] == "unanswered"
    # the store gains the call: the same bytes are answered from it at once
    with build_store(settings) as store:
        store.add(Record.from_answer(API, "{'a': 2}", {"error": "", "response": "stored later"}, "simulated", "test"),
                  canonical_from_upstream_key("{'a': 2}"))
    r = post(server, second)
    assert (r.headers["x-stm-outcome"], r.json()["response"]) == ("hit", "stored later")
    # the frozen file is rewritten: the same bytes get the new answer
    before = path.stat().st_mtime_ns
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "frozen after"}}))
    os.utime(path, ns=(before + 10**9, before + 10**9))
    assert post(server, first).json()["response"] == "frozen after"


def test_bad_bodies_are_answered_alike_the_second_time(serve, settings_factory) -> None:
    server = serve(settings_factory(mode="replay"))
    for data in (b"{bad", b"[1]", json.dumps({"category": "x"}).encode(), body({"a": 1}, api_name="chat_with_user"), b"\xff"):
        a, b = post(server, data), post(server, data)
        assert (a.status_code, a.content) == (b.status_code, b.content)


def call(i: int) -> ToolCall:
    return ToolCall.of("Tools", "t", "a", {"i": i})


def test_the_kept_calls_are_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepared, "MAX_CALLS", 3)
    monkeypatch.setattr(prepared, "MAX_BODY_BYTES", 100)
    kept = PreparedCalls()
    for i in range(5):
        kept.put(b"body %d" % i, call(i))
    assert len(kept) == 3
    assert kept.get(b"body 0") is None and kept.get(b"body 1") is None
    assert kept.get(b"body 4") == call(4)
    kept.put(b"x" * 101, call(9))
    assert kept.get(b"x" * 101) is None and len(kept) == 3


@pytest.mark.parametrize("field", ["category", "tool_name", "api_name", "strip", "toolbench_key", "tool_input", "tool_input_dict"])
def test_a_lone_surrogate_in_any_field_is_refused_naming_it(field: str) -> None:
    payload = {"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": "{}", "strip": "", "toolbench_key": ""}
    if field == "tool_input_dict":
        payload["tool_input"] = {"q": "caf\u00e9 \ud800"}
        field = "tool_input"
    else:
        payload[field] = "x\ud800y"
    with pytest.raises(ValueError, match=f"{field} contains a lone UTF-16 surrogate"):
        VirtualRequest.model_validate(payload)
    payload[field] = "caf\u00e9 \U0001f600"
    VirtualRequest.model_validate(payload)


def test_plain_and_other_requests_add_up_in_stats(serve, settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    path = tree.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "x"}}))
    server = serve(settings_factory(mode="replay", frozen_caches=[str(tree)]))
    for data in [body({"a": 1})] * 3 + [body({"a": 2})] * 2 + [b"{bad"]:
        post(server, data)
    stats = requests.get(server.url + "/stats", timeout=10).json()
    assert (stats["requests"], stats["hits"], stats["unanswered"], stats["rejected"]) == (6, 3, 2, 1)
    assert stats["by_source"] == {"frozen": 3}
    assert stats["by_api"][API] == {"hits": 3, "unanswered": 2, "misses": 2}
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert 'outcome="hit"} 3.0' in metrics


def test_the_ceiling_benchmark_refuses_without_wrk(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no wrk on it
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ceiling.py")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "wrk is not installed: apt-get install wrk" in proc.stderr


# -- round two: one write per answer, one header timer per connection, the store's kept reads ---------------


class _CountedTransport:
    """A real transport whose writes are also recorded (what the protocol hands the socket, write by write)."""

    def __init__(self, transport: Any, writes: list[bytes]) -> None:
        self.transport = transport
        self.writes = writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _counting(base: type, writes: list[bytes]) -> type:
    class Counting(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_CountedTransport(transport, writes))

    return Counting


def _exchange(port: int, request: bytes, head_only: bool = False) -> bytes:
    """One request on a fresh connection; its whole answer (status line, headers but ``date``, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0 if head_only else int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(rest) < length:
            rest += sock.recv(65536)
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(lines) + b"\r\n\r\n" + rest


def test_an_answer_is_one_write_of_the_same_bytes(settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    path = tree.joinpath(*API.split("/")).with_suffix(".json")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"{'a': 1}": {"error": "", "response": "frozen"}}))
    settings = settings_factory(mode="replay", frozen_caches=[str(tree)])
    hit = body({"a": 1})
    requests_ = [
        (b"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(hit), hit), False),
        (b"POST /virtual HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(hit), hit), False),
        (b"POST /virtual HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{bad", False),
        (b"GET /virtual HTTP/1.1\r\nHost: x\r\n\r\n", False),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", False),
        (b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
    ]
    answers: dict[str, list[bytes]] = {}
    writes: list[bytes] = []
    counts: list[int] = []
    options = uvicorn_options(settings)
    for name, protocol in (("guarded", _counting(GuardedHttpProtocol, writes)), ("plain", HttpToolsProtocol)):
        if name == "guarded":
            protocol = functools.partial(protocol, **options["http"].keywords)
        with UvicornThread(create_app(settings), http=protocol, timeout_keep_alive=options["timeout_keep_alive"]) as server:
            for request, head_only in requests_:
                before = len(writes)
                answers.setdefault(name, []).append(_exchange(server.port, request, head_only))
                if name == "guarded":
                    counts.append(len(writes) - before)
    # byte for byte what uvicorn's own protocol sends (its date aside), each answer in one write
    assert answers["guarded"] == answers["plain"]
    assert b"x-stm-outcome: hit" in answers["guarded"][0] and b"x-stm-outcome: hit" in answers["guarded"][1]
    assert counts == [1] * len(requests_)
    assert b"".join(writes).replace(b"\r\n", b"\n").count(b"HTTP/1.1 ") == len(requests_)


def test_one_header_timer_still_closes_a_later_stalled_request(serve, settings_factory, monkeypatch) -> None:
    """A kept-alive connection's timer, armed by its first request, waits for the full header timeout of the next."""
    timeout = 2.0  # wide enough for the steps below to fall where they should on a loaded machine
    monkeypatch.setattr(uvicorn_protocol, "HEADER_TIMEOUT_S", timeout)
    server = serve(settings_factory())
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.5 * timeout)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        stalled = time.monotonic()
        time.sleep(max(0.0, start + timeout + 0.25 - time.monotonic()))
        # the precondition, measured: this look falls past the first request's timeout and before the second's
        assert start + timeout < time.monotonic() < stalled + 0.9 * timeout, (start, stalled, time.monotonic())
        sock.settimeout(0.05)
        with pytest.raises((socket.timeout, TimeoutError)):
            sock.recv(65536)  # still open past the first request's timeout
        sock.settimeout(stalled + timeout + 5 - time.monotonic())
        assert sock.recv(65536) == b"", "the stalled request's connection was not closed"
        assert time.monotonic() - stalled >= timeout * 0.95


_WRITER = r"""
import sys
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore
what, path, api, key, text = sys.argv[1:]
store = DiskcacheStore(path)
if what == "add":
    store.add(Record.from_answer(api, key, {"error": "", "response": text}, "simulated", "other process"), None)
elif what == "replace":
    store.replace(Record.from_answer(api, key, {"error": "", "response": text}, "simulated", "other process"), None)
else:
    store.delete(api, [key])
store.close()
"""


def _other_process(what: str, path: Path, key: str, text: str = "") -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", _WRITER, what, str(path), API, key, text], check=True, env=env, timeout=60)


def _response(record: Record | None) -> str | None:
    return None if record is None else json.loads(record.body)["response"]


def test_kept_store_reads_see_another_processes_writes_at_once(tmp_path: Path) -> None:
    from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore

    path = tmp_path / "store"
    store = DiskcacheStore(path)
    reader = None
    try:
        assert store.get(API, "{'k': 1}") is None and store.get(API, "{'k': 1}") is None  # a miss, kept
        _other_process("add", path, "{'k': 1}", "added elsewhere")
        assert _response(store.get(API, "{'k': 1}")) == "added elsewhere"
        reader = DiskcacheStore(path, read_only=True)
        assert _response(reader.get(API, "{'k': 1}")) == "added elsewhere"
        _other_process("replace", path, "{'k': 1}", "replaced elsewhere")
        assert _response(store.get(API, "{'k': 1}")) == "replaced elsewhere"
        assert _response(reader.get(API, "{'k': 1}")) == "replaced elsewhere"
        _other_process("delete", path, "{'k': 1}")
        assert store.get(API, "{'k': 1}") is None and reader.get(API, "{'k': 1}") is None
        # this process's own writes, through another store object and through this one
        with DiskcacheStore(path) as other:
            other.add(Record.from_answer(API, "{'k': 1}", {"error": "", "response": "same process"}, "simulated", "t"), None)
        assert _response(store.get(API, "{'k': 1}")) == "same process"
        store.delete(API, ["{'k': 1}"])
        assert store.get(API, "{'k': 1}") is None
    finally:
        store.close()
        if reader is not None:
            reader.close()


def test_a_kept_hit_gives_way_to_a_file_that_appears_in_an_earlier_tree(serve, settings_factory, tmp_path: Path) -> None:
    """Kept hits (engine/recent_hits.py) are served only while every tier they were looked up in is unchanged."""
    first, second = tmp_path / "first", tmp_path / "second"
    for tree in (first, second):
        tree.joinpath(*API.split("/")).parent.mkdir(parents=True)
    second.joinpath(*API.split("/")).with_suffix(".json").write_text(json.dumps({"{'a': 1}": {"error": "", "response": "second"}}))
    settings = settings_factory(mode="replay", frozen_caches=[str(first), str(second)])
    server = serve(settings)
    data = body({"a": 1})
    assert [post(server, data).json()["response"] for _ in range(3)] == ["second"] * 3
    first.joinpath(*API.split("/")).with_suffix(".json").write_text(json.dumps({"{'a': 1}": {"error": "", "response": "first"}}))
    assert post(server, data).json()["response"] == "first"
    # the store comes first: a record another store object adds is served at once, over the kept hit
    assert post(server, data).json()["response"] == "first"
    with build_store(settings) as store:
        store.add(Record.from_answer(API, "{'a': 1}", {"error": "", "response": "stored"}, "simulated", "test"),
                  canonical_from_upstream_key("{'a': 1}"))
    r = post(server, data)
    assert (r.json()["response"], r.headers["x-stm-source"]) == ("stored", "simulated")
    stats = requests.get(server.url + "/stats", timeout=10).json()
    assert stats["hits"] == 6  # kept hits are counted like any hit


def test_kept_hits_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
    from stabletoolbench_mirror.engine import recent_hits
    from stabletoolbench_mirror.engine.recent_hits import MAX_BODY_CHARS, RecentHits

    monkeypatch.setattr(recent_hits, "MAX_HITS", 2)
    hits = RecentHits(lambda: b"g", [])
    token = hits.token(API)
    assert token == (b"g",)
    for i in range(3):
        hits.put(call(i), token, Outcome("{}", OutcomeKind.HIT))
    assert len(hits._hits) == 2 and hits.get(call(0), token) is None  # noqa: SLF001 - the least recently used is forgotten first
    assert hits.get(call(2), token) is not None and hits.get(call(2), (b"h",)) is None
    assert hits.get(call(1), token) is not None  # used now: call(2) is the least recent
    hits.put(call(3), token, Outcome("{}", OutcomeKind.HIT))
    assert len(hits._hits) == 2 and hits.get(call(2), token) is None and hits.get(call(1), token) is not None  # noqa: SLF001
    hits.put(call(5), token, Outcome("x" * (MAX_BODY_CHARS + 1), OutcomeKind.HIT))
    assert hits.get(call(5), token) is None
    assert RecentHits(lambda: None, []).token(API) is None  # no generation now: nothing kept


def test_access_lines_are_built_only_where_they_are_written(settings_factory) -> None:
    """uvicorn's access log is on where its lines are written (log_level info, debug) and off below (nothing to write)."""
    assert [uvicorn_options(settings_factory(log_level=level))["access_log"] for level in ("debug", "info", "warning", "error")] == \
        [True, True, False, False]
