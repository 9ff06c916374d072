"""Memory stays bounded whatever clients do (issue 18, item 3): bodies being read count against
``limits.max_queued_bytes``, and a client that reads nothing of its answer for ``limits.send_timeout_s`` is
dropped.  Real sockets against a real ``serve`` process; resident memory from /proc."""

from __future__ import annotations

import bisect
import json
import socket
import time
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.crowd import close_all, peer_closed, request_without_reading, rss_mb, stalled_bodies
from tests.helpers.processes import ServeProcess

NS = "Data/memory_tool_for_Data/big"


def payload(n: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Memory Tool", "api_name": "big", "tool_input": json.dumps({"n": n}),
            "strip": "", "toolbench_key": ""}


def settle(pid: int, s: float = 1.0) -> float:
    time.sleep(s)
    return rss_mb(pid)


def test_1000_stalled_1mb_bodies_stay_within_max_queued_bytes(tmp_path: Path) -> None:
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
              "limits": {"max_queued_bytes": 64 * 1024 * 1024, "body_timeout_s": 60}}
    with ServeProcess(tmp_path, config) as server:
        requests.post(server.url + "/virtual", json=payload(0), timeout=10)  # the path warmed up once
        start = settle(server.pid)
        socks = stalled_bodies(server.port, 1000)
        try:
            peak = settle(server.pid)
            stats = requests.get(server.url + "/stats", timeout=10).json()
            answered = b""
            for sock in socks[-50:]:  # the last ones were refused at their headers
                sock.settimeout(0.2)
                try:
                    answered = sock.recv(65536)
                except OSError:
                    continue
                if answered:
                    break
        finally:
            close_all(socks)
        # once they are gone, their bytes are given back: the next request is read and answered (as soon as the
        # server has seen them go; a generous deadline for a busy machine)
        deadline = time.monotonic() + 30
        while (after := requests.post(server.url + "/virtual", json=payload(1), timeout=10)).status_code == 503:
            assert time.monotonic() < deadline, "the stalled bodies' bytes were not given back within 30 s"
            time.sleep(0.1)
    assert peak - start <= 160, f"1,000 stalled 1 MB bodies took the server from {start:.0f} MB to {peak:.0f} MB"
    # 64 MiB hold about 63 bodies of 1 MiB and their overhead: all the others were refused
    assert stats["refusals"].get("limits.max_queued_bytes", 0) >= 900, stats["refusals"]
    head, _, body = answered.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in head.lower(), answered[:300]
    assert "limits.max_queued_bytes" in json.loads(body)["error"]
    assert after.status_code == 200 and after.headers["x-stm-outcome"] == "unanswered"


def test_a_body_over_max_queued_bytes_is_refused_with_the_setting_and_counted_until_it_is_gone(serve, settings_factory) -> None:
    server = serve(settings_factory(mode="replay", limits={"max_queued_bytes": 200_000, "body_timeout_s": 30}))
    port = int(server.url.rsplit(":", 1)[1])
    (holder,) = stalled_bodies(port, 1, body_bytes=150_000)  # holds 150,000 + 15 KiB while its body is read
    try:
        deadline = time.monotonic() + 10
        while not server.server.server_state.tasks:  # uvicorn took the stalled request's headers: it is being read
            assert time.monotonic() < deadline, "the stalled request never reached the server"
            time.sleep(0.01)
        r = requests.post(server.url + "/virtual", json=dict(payload(1), tool_input=json.dumps({"q": "x" * 50_000})), timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json() == {
            "error": "stabletoolbench-mirror is overloaded (165360 bytes of requests are already being read or waiting); "
                     "the server's limits.max_queued_bytes setting bounds this",
            "response": "",
        }
        assert r.headers["x-stm-outcome"] == "refused"
        # a small request still fits beside it
        assert requests.post(server.url + "/virtual", json=payload(2), timeout=10).status_code == 200
    finally:
        holder.close()
    # the stalled body went away: its bytes are given back once the server has seen it go (each try before that
    # is refused, and counted)
    refused_again = 0
    deadline = time.monotonic() + 10
    big = dict(payload(1), tool_input=json.dumps({"q": "x" * 150_000}))
    while (r := requests.post(server.url + "/virtual", json=big, timeout=10)).status_code == 503:
        assert time.monotonic() < deadline, "the stalled body's bytes were not given back within 10 s"
        refused_again += 1
        time.sleep(0.05)
    assert r.status_code == 200
    stats = requests.get(server.url + "/stats", timeout=10).json()
    assert stats["refusals"] == {"limits.max_queued_bytes": 1 + refused_again}


def _store_with_big_answer(path: Path, size: int) -> None:
    with DiskcacheStore(path) as store:
        store.add(Record.from_answer(NS, "{'n': 1}", {"error": "", "response": "x" * size}, "imported"), None)


def peak_mb(pid: int) -> float:
    """The resident high-water mark of process ``pid`` in MB (``VmHWM``, reset by ``clear_refs``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def answered_at(socks: list[socket.socket], deadline_s: float = 60) -> list[float]:
    """When each non-reading client's answer began to arrive: its first bytes seen in the kernel's buffer (peeked,
    never read), polled with a generous deadline."""
    made: dict[int, float] = {}
    for sock in socks:
        sock.setblocking(False)
    deadline = time.monotonic() + deadline_s
    while len(made) < len(socks) and time.monotonic() < deadline:
        for i, sock in enumerate(socks):
            if i not in made:
                try:
                    if sock.recv(1, socket.MSG_PEEK):
                        made[i] = time.monotonic()
                except BlockingIOError:
                    pass
                except OSError:  # reset: its answer was made and then dropped
                    made[i] = time.monotonic()
        time.sleep(0.01)
    for sock in socks:
        sock.settimeout(10)
    return sorted(made.values())


def held_at_once(made: list[float], window_s: float) -> int:
    """The most answers made within ``window_s`` of each other: a client is dropped only once it has read nothing for
    the send timeout, so answers made closer together than that were all held at the same time."""
    return max((bisect.bisect_left(made, t + window_s) - i for i, t in enumerate(made)), default=0)


def back_to(pid: int, start: float, within_mb: float, deadline_s: float = 30) -> float:
    """Polls the resident memory until it is within ``within_mb`` of ``start`` (or the deadline): the last reading."""
    deadline = time.monotonic() + deadline_s
    while (rss := rss_mb(pid)) - start > within_mb and time.monotonic() < deadline:
        time.sleep(0.2)
    return rss


def test_200_clients_that_never_read_a_4mb_answer_are_dropped_after_the_send_timeout(tmp_path: Path) -> None:
    """Everything the verdict rests on is measured in this run: what one held answer costs this server (a first
    round of 25 clients), how many of the 200 answers were held at once (when each began to arrive), and the
    peak.  The 200 must have held about what that many answers cost, and 30 s later at most a quarter of the peak's
    growth may be left (never more than 100 MB)."""
    _store_with_big_answer(tmp_path / "store", 4 * 1024 * 1024)
    timeout_s = 3
    config = {"mode": "replay", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
              "limits": {"send_timeout_s": timeout_s}}
    body = json.dumps(payload(1)).encode()
    with ServeProcess(tmp_path, config) as server:
        requests.post(server.url + "/virtual", json=payload(0), timeout=30)
        start = settle(server.pid)
        # the baseline: what 25 held answers cost (the kernel takes part of each answer into its socket buffers)
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")
        few = request_without_reading(server.port, 25, body)
        try:
            few_made = answered_at(few)
            time.sleep(0.2)
            few_peak = peak_mb(server.pid)
        finally:
            close_all(few)  # reset with their answers unread: the server lets them go
        few_held = held_at_once(few_made, 0.9 * timeout_s)
        per_answer_mb = (few_peak - start) / max(few_held, 1)
        start = back_to(server.pid, start, 20, deadline_s=15)  # the next round's start: what the first left, if anything
        # the 200; the peak is the kernel's high-water mark since now (not samples a busy machine may space out)
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")
        socks = request_without_reading(server.port, 200, body)
        try:
            made = answered_at(socks)
            peak = peak_mb(server.pid)
            rss = back_to(server.pid, start, min(100, 0.25 * (peak - start)), deadline_s=30)
            peak = max(peak, peak_mb(server.pid))
            closed = sum(peer_closed(sock, 0.5) for sock in socks[:20])
        finally:
            close_all(socks)
        r = requests.post(server.url + "/virtual", json=payload(1), timeout=30)  # a client that reads gets it all
    held = held_at_once(made, 0.9 * timeout_s)
    figures = (f"baseline: {few_held} of 25 held at once, {per_answer_mb:.1f} MB each; then {len(made)} of 200 answered, {held} held "
               f"at once: {start:.0f} MB -> at most {peak:.0f} MB -> {rss:.0f} MB")
    # the preconditions, measured: answers were held at once, and they took what the baseline says they cost
    assert len(made) == 200 and held >= 25, figures
    assert peak - start >= 0.5 * per_answer_mb * held and per_answer_mb >= 1, figures
    # the verdict: the memory given back, bounded by the growth measured in this run
    assert rss - start <= min(100, 0.25 * (peak - start)), f"non-reading clients still hold memory 30 s later (send timeout 3 s): {figures}"
    assert closed == 20, "the server dropped the clients that read nothing"
    assert r.status_code == 200 and len(r.content) > 4 * 1024 * 1024
    print(f"\n{figures}")


def test_a_slow_reader_that_keeps_reading_is_not_dropped(tmp_path: Path, serve, settings_factory) -> None:
    size = 12 * 1024 * 1024  # more than the kernel's socket buffers take: the server's buffer holds the rest
    _store_with_big_answer(tmp_path / "big", size)
    settings = settings_factory(mode="replay", store={"kind": "diskcache", "path": str(tmp_path / "big")},
                                limits={"send_timeout_s": 0.5})
    server = serve(settings)
    port = int(server.url.rsplit(":", 1)[1])
    (sock,) = request_without_reading(port, 1, json.dumps(payload(1)).encode(), rcvbuf=8192)
    got = bytearray()
    started = time.monotonic()
    with sock:
        sock.settimeout(5)
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < size + 25:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            got += chunk
            time.sleep(0.001)  # a few MB/s at most, through a small buffer: never idle for 0.5 s
    elapsed = time.monotonic() - started
    head, _, answer = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(answer) == size + 26, f"dropped after {len(answer)} bytes, {elapsed:.1f} s"
    assert json.loads(answer) == {"error": "", "response": "x" * size}
    assert elapsed > 1.5, "the reader was not slow enough to test anything"
