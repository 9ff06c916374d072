"""``mode: refresh`` over real HTTP: a real server, a real simulator endpoint (the OpenAI stub), a real store.

Another simulator replaces the usable records it reaches (keeping their provenance); a failing
simulator replaces none (the recorded answers are served); outside ``refresh``'s scope a call is a hit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.openai_stub import OpenAIStub, Reply

APIS = {"lookup": "Data/flaky_for_Data/lookup", "search": "Data/flaky_for_Data/search"}
CALLS = [(api, n) for api in APIS for n in range(4)]


def call(api: str, n: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Flaky", "api_name": api, "tool_input": json.dumps({"n": n}), "strip": "", "toolbench_key": ""}


def simulator(version: str):
    """A simulator whose answers say which version wrote them ("broken": not JSON, a failure)."""

    def reply(body: dict[str, Any]) -> Reply:
        if version == "broken":
            return Reply(content="Sure! I think the lookup found something.")
        return Reply(content=json.dumps({"error": "", "response": f"{version} answer"}))

    return reply


def settings(settings_factory, stub: OpenAIStub, **extra: Any):
    sim = {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "read_timeout_s": 10}
    return settings_factory(simulator=sim, **extra)


def run(server) -> dict[tuple[str, int], dict[str, Any]]:
    with requests.Session() as session:
        out = {}
        for api, n in CALLS:
            r = session.post(server.url + "/virtual", json=call(api, n), timeout=30)
            assert r.status_code == 200, r.text
            out[api, n] = r.json()
        return out


def records(tmp_path: Path) -> dict[tuple[str, str], Any]:
    with DiskcacheStore(tmp_path / "store") as store:
        return {(r.api, r.key): r for r in store}


def test_refresh_replaces_what_another_simulator_answers_and_nothing_a_failing_one_does(serve, settings_factory, tmp_path: Path) -> None:
    with OpenAIStub(simulator("v1")) as v1, OpenAIStub(simulator("v2")) as v2, OpenAIStub(simulator("broken")) as broken:
        first = run(serve(settings(settings_factory, v1)))
        assert all(a["response"] == "v1 answer" for a in first.values())
        recorded = records(tmp_path)
        assert len(recorded) == len(CALLS)

        # record mode with the other simulator: every call a hit, nobody asked
        assert run(serve(settings(settings_factory, v2))) == first and v2.count == 0

        refresher = serve(settings(settings_factory, v2, mode="refresh"))
        second = run(refresher)
        assert all(a["response"] == "v2 answer" for a in second.values()) and v2.count == len(CALLS)
        stats = requests.get(refresher.url + "/stats", timeout=10).json()
        assert stats["replaced"] == len(CALLS) and stats["hits"] == 0
        now = records(tmp_path)
        assert set(now) == set(recorded)  # the same keys: replaced, not added
        for where, record in now.items():
            assert record.answer["response"] == "v2 answer"
            assert record.replaced is not None and record.replaced["body"] == recorded[where].body  # provenance kept
            assert record.replaced["created_at"] == recorded[where].created_at
        counted = json.loads(requests.get(refresher.url + "/stats", timeout=10).text)
        assert counted["misses"] == len(CALLS)

        # a failing simulator in refresh mode: asked, replaces nothing, the recorded answers are served
        failing = serve(settings(settings_factory, broken, mode="refresh"))
        assert run(failing) == second and broken.count == len(CALLS)
        stats = requests.get(failing.url + "/stats", timeout=10).json()
        assert stats["failed"] == 0 and stats["replaced"] == 0 and stats["failure_records"] == 0
        assert {w: r.body for w, r in records(tmp_path).items()} == {w: r.body for w, r in now.items()}
        assert not any(r.is_failure for r in records(tmp_path).values())


def test_refresh_scope_leaves_other_calls_as_record_mode_does(serve, settings_factory, tmp_path: Path) -> None:
    with OpenAIStub(simulator("v1")) as v1, OpenAIStub(simulator("v2")) as v2:
        first = run(serve(settings(settings_factory, v1)))
        scoped = serve(settings(settings_factory, v2, mode="refresh", refresh={"apis": [APIS["lookup"]]}))
        second = run(scoped)
        for (api, n), answer in second.items():
            assert answer["response"] == ("v2 answer" if api == "lookup" else "v1 answer")
            if api == "search":
                assert answer == first[api, n]
        assert v2.count == 4
        # older_than_days: records made just now are not old enough: nothing asked
        young = serve(settings(settings_factory, v2, mode="refresh", refresh={"older_than_days": 1}))
        assert run(young) == second and v2.count == 4
        # sources: the answers are simulated, so a scope of real answers leaves them alone
        real_only = serve(settings(settings_factory, v2, mode="refresh", refresh={"sources": ["real"]}))
        assert run(real_only) == second and v2.count == 4


def test_a_repeated_call_is_refreshed_once_per_run_keeping_the_original(serve, settings_factory, tmp_path: Path) -> None:
    """The second identical call of a refresh run is a hit: ``replaced`` keeps the answer the run found."""
    with OpenAIStub(simulator("v1")) as v1, OpenAIStub(simulator("v2")) as v2:
        run(serve(settings(settings_factory, v1)))
        original = records(tmp_path)
        refresher = serve(settings(settings_factory, v2, mode="refresh"))
        first, again = run(refresher), run(refresher)
        assert first == again and v2.count == len(CALLS)  # asked once per call, not twice
        stats = requests.get(refresher.url + "/stats", timeout=10).json()
        assert stats["replaced"] == len(CALLS) and stats["hits"] == len(CALLS)
        for where, record in records(tmp_path).items():
            assert record.answer["response"] == "v2 answer"
            assert record.replaced is not None and record.replaced["body"] == original[where].body
        # the next run (a new start) refreshes again, once
        run(serve(settings(settings_factory, v2, mode="refresh")))
        assert v2.count == 2 * len(CALLS)
