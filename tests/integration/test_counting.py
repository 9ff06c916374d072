"""Honest counters: every /virtual request ends in exactly one outcome, counted once.

Over real HTTP: the ``X-STM-Outcome`` of each response and ``GET /stats`` agree, the
outcome counters add up to ``requests``, and requests that waited on another's miss
are counted as ``shared``, not as ``recorded``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.engine.responders import Attempt
from stabletoolbench_mirror.engine.stats import COUNTER_NAMES
from stabletoolbench_mirror.factory import build_store

API = "Tools/t_for_Tools/a"


def payload(tool_input: Any, **fields: str) -> dict[str, str]:
    body = {"category": "Tools", "tool_name": "t", "api_name": "a", "tool_input": json.dumps(tool_input), "strip": "", "toolbench_key": ""}
    body.update(fields)
    return body


class GatedResponder:
    """Answers only once ``waiting`` misses are pending in the layer, so all of them missed first."""

    source = "simulated"

    def __init__(self, waiting: int, *, usable: bool = True) -> None:
        self.waiting = waiting
        self.usable = usable
        self.layers: list[MirrorLayer] = []
        self.calls = 0

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        self.calls += 1
        deadline = time.monotonic() + 60
        # only the first call waits (a later one, if any, must not wait for requests that are gone)
        while self.calls == 1 and sum(x.misses.pending._turns.in_use for x in self.layers) < self.waiting and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.005)
        if not self.usable:
            return Attempt(None, "gated", "not usable on purpose")
        return Attempt({"error": "", "response": f"answer to {call.key}"}, "gated")

    def close(self) -> None:
        pass


def start(serve, settings_factory, responder: GatedResponder):
    settings = settings_factory()
    layer = MirrorLayer(build_store(settings), responders=[responder])
    responder.layers.append(layer)
    return serve(settings, layer)


def stats(server) -> dict[str, Any]:
    return requests.get(server.url + "/stats", timeout=10).json()


def outcome_sum(s: dict[str, Any]) -> int:
    return sum(s[name] for name in COUNTER_NAMES.values())


def concurrent_posts(server, bodies: list[dict[str, str]]) -> list[requests.Response]:
    barrier = threading.Barrier(len(bodies))

    def post(body: dict[str, str]) -> requests.Response:
        barrier.wait()
        return requests.post(server.url + "/virtual", json=body, timeout=120)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


@pytest.mark.parametrize("n", [8, 32])
def test_concurrent_identical_misses_one_recorded_the_rest_shared(serve, settings_factory, n: int) -> None:
    responder = GatedResponder(waiting=n)
    server = start(serve, settings_factory, responder)
    replies = concurrent_posts(server, [payload({"q": "same"})] * n)
    assert {r.content for r in replies} == {b'{"error":"","response":"answer to {\'q\': \'same\'}"}'}
    kinds = sorted(r.headers["x-stm-outcome"] for r in replies)
    assert kinds == ["recorded"] + ["shared"] * (n - 1)
    assert responder.calls == 1
    s = stats(server)
    assert (s["requests"], s["recorded"], s["shared"], s["misses"], s["hits"]) == (n, 1, n - 1, n, 0)
    assert outcome_sum(s) == n
    assert s["by_api"][API] == {"recorded": 1, "shared": n - 1, "misses": n}
    assert s["by_source"] == {"simulated": n}
    # the next call is a plain hit
    again = server.post(payload({"q": "same"}))
    assert again.headers["x-stm-outcome"] == "hit"
    s = stats(server)
    assert (s["requests"], s["hits"], outcome_sum(s)) == (n + 1, 1, n + 1)


def test_misses_waiting_on_another_process_are_shared(serve, settings_factory) -> None:
    """Two servers on one diskcache folder (as ``serve --workers 2``): the store's lock makes one fill, the other share."""
    n = 4
    responder = GatedResponder(waiting=2 * n)
    one = start(serve, settings_factory, responder)
    two = start(serve, settings_factory, responder)  # its own store object: the lock excludes it like another process
    bodies = [payload({"q": "same"})] * n
    with ThreadPoolExecutor(2) as pool:
        replies = [r for batch in pool.map(lambda server: concurrent_posts(server, bodies), [one, two]) for r in batch]
    assert len({r.content for r in replies}) == 1 and responder.calls == 1
    assert sorted(r.headers["x-stm-outcome"] for r in replies) == ["recorded"] + ["shared"] * (2 * n - 1)
    s1, s2 = stats(one), stats(two)
    assert s1["requests"] == s2["requests"] == n
    assert (s1["recorded"] + s2["recorded"], s1["shared"] + s2["shared"]) == (1, 2 * n - 1)
    assert outcome_sum(s1) == outcome_sum(s2) == n


def test_waiters_on_a_failed_miss_are_failed_and_the_reason_counted_once(serve, settings_factory) -> None:
    responder = GatedResponder(waiting=4, usable=False)
    server = start(serve, settings_factory, responder)
    replies = concurrent_posts(server, [payload({"q": "bad"})] * 4)
    assert [r.headers["x-stm-outcome"] for r in replies] == ["failed"] * 4
    s = stats(server)
    assert (s["requests"], s["failed"], s["misses"], s["recorded"], s["shared"]) == (4, 4, 4, 0, 0)
    # the reason is counted per responder call (normally one), not per waiting request
    assert s["failures"] == {"simulated: not usable on purpose": responder.calls}
    assert outcome_sum(s) == 4


def test_every_kind_of_request_counts_once(serve, settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "Tools" / "t_for_Tools"
    tree.mkdir(parents=True)
    (tree / "a.json").write_text(json.dumps({"{'q': 'frozen'}": {"error": "", "response": "from the tree"}}))
    settings = settings_factory(mode="replay", frozen_caches=[str(tmp_path / "tree")])
    server = serve(settings)
    url = server.url + "/virtual"
    sent = [
        (server.post(payload({"q": "frozen"})), "hit", 200),
        (server.post(payload({"q": "missing"})), "unanswered", 200),
        (server.post(payload({"q": 1}, api_name="chat_with_user")), "local", 200),
        (server.post({**payload({}), "tool_input": "not json"}), "rejected", 200),
        (server.post({"category": "Tools"}), "rejected", 422),
        (requests.post(url, data=b"{not json", timeout=10), "rejected", 400),
        (requests.get(url, timeout=10), "rejected", 405),
    ]
    for reply, kind, status in sent:
        assert (reply.headers["x-stm-outcome"], reply.status_code) == (kind, status), reply.text
    s = stats(server)
    assert (s["requests"], s["hits"], s["unanswered"], s["local"], s["rejected"], s["misses"]) == (7, 1, 1, 1, 4, 1)
    assert outcome_sum(s) == s["requests"]
    assert s["by_source"] == {"frozen": 1}
