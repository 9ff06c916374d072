"""Shadow pairs: a simulator answer kept beside each real answer in a separate store, never served."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests

from stabletoolbench_mirror.commands.cli import main
from stabletoolbench_mirror.config import load_settings
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.engine.responders import Attempt
from stabletoolbench_mirror.factory import build_layer, build_shadow_store
from stabletoolbench_mirror.responders.shadow import ShadowedResponder
from stabletoolbench_mirror.responders.simulator import build_simulator
from stabletoolbench_mirror.serving.server import create_app
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.api_host import ApiHost, Received, relay_reply
from tests.helpers.live import UvicornThread
from tests.helpers.openai_stub import OpenAIStub, Reply


def relay(received: Received):
    body = received.json()
    q = body["tool_input"]["q"]
    if q == "broken":
        return relay_reply("", "Rate limit exceeded")  # not a valid real answer (upstream rules)
    return relay_reply("", f"real answer for {q}")


def simulator(body: dict[str, Any]) -> Reply:
    request = body["messages"][1]["content"].rsplit("Request:\n", 1)[1]
    return Reply(content=json.dumps({"error": "", "response": f"simulated answer for {request}"}))


def payload(q: str) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Keyword Analysis", "api_name": "QueryKeywords", "tool_input": json.dumps({"q": q}),
            "strip": "", "toolbench_key": ""}  # fmt: skip


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_shadow_answers_are_kept_apart_and_scored(tmp_path: Path, reference_dir: Path) -> None:
    with ApiHost(relay) as host, OpenAIStub(simulator) as stub:
        config = tmp_path / "config.yml"
        config.write_text(
            json.dumps(
                {
                    "store": {"path": str(tmp_path / "store")},
                    "tools_folder": str(reference_dir / "toolenv" / "tools"),
                    "real": {"enabled": True, "relay_url": host.url + "/relay", "shadow_simulate": True},
                    # the simulator is not in the miss chain; its settings describe the shadow simulator
                    "simulator": {"enabled": False, "api_base": stub.api_base, "style": "mirrorapi-cot"},
                }
            )
        )
        settings = load_settings(config, environ={})
        layer = build_layer(settings)
        with UvicornThread(create_app(settings, layer)) as server:
            served = {q: server.post(payload(q)) for q in ("cats", "dogs", "birds")}
            for q, answer in served.items():
                assert answer.json() == {"error": "", "response": f"real answer for {q}"}
                assert answer.headers["X-STM-Source"] == "real"
            shadow = build_shadow_store(settings)
            wait_for(lambda: len(shadow) == 3)
            # a real answer that is not valid: no simulator in the chain, so the miss error, never the shadow
            broken = server.post(payload("broken"))
            assert broken.json()["error"] == "API not working error..."
            # replays come from the main store; the shadow simulator is not asked again
            before = stub.count
            assert server.post(payload("cats")).json() == served["cats"].json()
            assert stub.count == before == 3
            stats = requests.get(server.url + "/stats", timeout=10).json()
            assert stats["shadow"] == {"shadow_recorded": 3, "shadow_failed": 0, "shadow_skipped": 0}
            health = requests.get(server.url + "/health", timeout=10).json()
            assert health["simulator_prompt"]["style"] == "mirrorapi-cot"
        layer.close()
        shadow_records = sorted(shadow, key=lambda r: r.key)
        shadow.close()
    assert [(r.source, r.answer["response"]) for r in shadow_records] == [
        ("simulated", "simulated answer for {'q': 'birds'}"),
        ("simulated", "simulated answer for {'q': 'cats'}"),
        ("simulated", "simulated answer for {'q': 'dogs'}"),
    ]
    assert all(r.meta and r.meta["style"] == "mirrorapi-cot" for r in shadow_records)
    with DiskcacheStore(str(tmp_path / "store")) as store:
        # the three real answers, and the invalid one as a failure record (what the client was served)
        assert sorted((r.source, r.is_failure) for r in store) == [("real", False)] * 3 + [("real", True)]
    assert Path(str(tmp_path / "store") + "-shadow").is_dir()

    out = tmp_path / "shadow.json"
    assert main(["fidelity", "--config", str(config), "--from-store", "--shadow", "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["aggregate"]["n"] == 3
    for row in report["calls"]:
        assert row["reference"]["response"] == f"real answer for {query_of(row['key'])}"
        assert row["candidate"]["response"] == f"simulated answer for {row['key']}"
        assert row["exact"] == 0.0 and 0 < row["bleu"] < 100


def query_of(key: str) -> str:
    return key.split("'q': '", 1)[1].rstrip("'}")


class _AlwaysReal:
    source = "real"

    def respond(self, call: ToolCall, examples: Any) -> Attempt:
        return Attempt({"error": "", "response": "real"}, "relay")

    def close(self) -> None:
        pass


def test_shadow_work_is_bounded_and_never_delays_an_answer(tmp_path: Path, settings_factory) -> None:
    with OpenAIStub(lambda body: Reply(content='{"error": "", "response": "slow"}', delay_s=2.0)) as stub:
        settings = settings_factory(simulator={"api_base": stub.api_base, "allow_without_docs": True})
        shadow = ShadowedResponder(_AlwaysReal(), build_simulator(settings), build_shadow_store(settings), max_pending=1)
        for i in range(3):
            assert shadow.respond(ToolCall.of("Data", "t", "a", {"i": i}), []).answer == {"error": "", "response": "real"}
        # the first simulation is still running (2 s): the others were skipped, not waited for
        assert shadow.stats()["shadow"]["shadow_skipped"] == 2
        shadow.close()  # waits for the accepted one
        assert shadow.stats()["shadow"] == {"shadow_recorded": 1, "shadow_failed": 0, "shadow_skipped": 2}
        assert stub.count == 1
