"""Only complete answers are recorded as answers: a chat completion that did not end by itself.

``finish_reason: length`` (cut at ``max_tokens``), ``content_filter``, ``tool_calls`` or none at
all, through the real server and layer against the OpenAI stub on 127.0.0.1: even when the text
parses, it is served as ``Failed to generate fake response``, recorded as a failure record that
names the cause, not asked again within the call (``parse_retries``), and asked again by the next
identical call in ``record`` mode.  The offline engine's counterpart is in ``test_warm_offline.py``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from stabletoolbench_mirror.commands.cli import main
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.responders import simulator as simulator_module
from stabletoolbench_mirror.responders.simulator.prompts import STYLES
from tests.helpers.openai_stub import OpenAIStub, Reply

MODEL = "mirror-test-model"
API_KEY = "sk-simulator-secret-789"
API = "Data/keyword_analysis_for_Data/popularsitesforquery"
PAYLOAD = {
    "category": "Data",
    "tool_name": "Keyword Analysis",
    "api_name": "PopularSitesForQuery",
    "tool_input": json.dumps({"q": "birthday party ideas"}),
    "strip": "truncate",
    "toolbench_key": "",
}
# text that parses (the tolerant extractor even closes a cut object): only finish_reason says it is cut
CUT = json.dumps({"error": "", "response": "pinterest.com, etsy.com, party"})
FULL = json.dumps({"error": "", "response": "pinterest.com, etsy.com, partycity.com"})


def in_order(*replies: Reply) -> Callable[[dict[str, Any]], Reply]:
    """Replies in order; the last one repeats."""
    lock = threading.Lock()
    queue = list(replies)

    def responder(body: dict[str, Any]) -> Reply:
        with lock:
            return queue.pop(0) if len(queue) > 1 else queue[0]

    return responder


@pytest.fixture
def mirror(serve, settings_factory, tmp_path: Path, monkeypatch) -> Iterator[Callable[..., Any]]:
    """A mirror server whose simulator talks to ``api_base``: (server, layer)."""
    monkeypatch.setattr(simulator_module, "BACKOFF_S", 0.01)
    root = tmp_path / "tools"
    (root / "Data").mkdir(parents=True)
    (root / "Data" / "keyword_analysis.json").write_text(json.dumps({
        "tool_name": "Keyword Analysis", "tool_description": "Find the sites that rank for a query.",
        "api_list": [{"name": "PopularSitesForQuery", "description": "Popular sites for a search query.", "method": "GET",
                      "required_parameters": [{"name": "q", "type": "STRING", "description": "query", "default": "cats"}],
                      "optional_parameters": []}],
    }))  # fmt: skip
    layers: list[MirrorLayer] = []

    def start(api_base: str, **simulator: Any):
        cfg = {"enabled": True, "api_base": api_base, "model": MODEL, "api_key": API_KEY, "max_retries": 1,
               "read_timeout_s": 5.0, "connect_timeout_s": 1.0, **simulator}  # fmt: skip
        settings = settings_factory(simulator=cfg, tools_folder=str(root))
        layer = build_layer(settings)
        layers.append(layer)
        return serve(settings, layer), layer, settings

    yield start
    for layer in layers:
        layer.close()


def stats(server) -> dict[str, Any]:
    return requests.get(server.url + "/stats", timeout=10).json()


@pytest.mark.parametrize("finish_reason", ["length", "content_filter"])
@pytest.mark.parametrize("style", STYLES)
def test_an_incomplete_completion_is_a_failure_record_asked_again(mirror, style: str, finish_reason: str) -> None:
    with OpenAIStub(in_order(Reply(content=CUT, finish_reason=finish_reason), Reply(content=FULL))) as stub:
        server, layer, _ = mirror(stub.api_base, style=style)
        first = server.post(PAYLOAD)
        assert first.status_code == 200 and first.json() == protocol.simulation_failed_answer()
        assert first.headers["X-STM-Outcome"] == "failed"
        # not asked again within the call, even by gpt-fewshot's default parse_retries (3)
        assert stub.count == 1
        (record,) = list(layer.store)
        cause = f"simulated: simulator output incomplete (finish_reason {finish_reason})"
        assert record.is_failure and record.body == first.text and record.reason == cause
        assert record.tried == (f"simulated:{MODEL}",) and record.meta is None
        s = stats(server)
        assert (s["recorded"], s["failed"], s["failure_records"]) == (0, 1, 1) and s["failures"] == {cause: 1}
        # record mode: the next identical call asks the model again, and keeps the complete answer
        second = server.post(PAYLOAD)
        assert second.json() == json.loads(FULL) and stub.count == 2
        (record,) = list(layer.store)
        assert not record.is_failure and record.meta is not None and record.meta["finish_reason"] == "stop"
        third = server.post(PAYLOAD)
        assert third.headers["X-STM-Outcome"] == "hit" and third.json() == json.loads(FULL) and stub.count == 2


@pytest.mark.parametrize(
    ("finish_reason", "cause"),
    [
        (None, "simulator output incomplete (no finish_reason)"),  # sent as null; a missing one reads the same
        ("", "simulator output incomplete (no finish_reason)"),
        ("tool_calls", "simulator output incomplete (finish_reason tool_calls)"),
        ("abort", "simulator output incomplete (finish_reason abort)"),
    ],
)
def test_a_completion_without_a_natural_end_is_incomplete(mirror, finish_reason: str | None, cause: str) -> None:
    with OpenAIStub(in_order(Reply(content=FULL, finish_reason=finish_reason))) as stub:
        server, layer, _ = mirror(stub.api_base)
        assert server.post(PAYLOAD).json() == protocol.simulation_failed_answer()
        (record,) = list(layer.store)
        assert record.is_failure and record.reason == f"simulated: {cause}"
        # asked again, and failed again: the recorded failure is served unchanged
        assert server.post(PAYLOAD).json() == protocol.simulation_failed_answer() and stub.count == 2


@pytest.mark.parametrize("finish_reason", ["stop", "eos_token", "stop_sequence", "eos"])
def test_the_natural_end_names_of_openai_compatible_servers_are_complete(mirror, finish_reason: str) -> None:
    with OpenAIStub(in_order(Reply(content=FULL, finish_reason=finish_reason))) as stub:
        server, layer, _ = mirror(stub.api_base)
        assert server.post(PAYLOAD).json() == json.loads(FULL)
        (record,) = list(layer.store)
        assert not record.is_failure and record.meta["finish_reason"] == finish_reason


def test_an_unparsable_cut_output_is_not_asked_again_and_names_the_cut(mirror) -> None:
    """parse_retries asks again for output the parser cannot read, not for output cut at max_tokens."""
    with OpenAIStub(in_order(Reply(content='{"error": "", "response": "pinterest.com, et', finish_reason="length"))) as stub:
        server, layer, _ = mirror(stub.api_base, parse_retries=2, seed=7)
        assert server.post(PAYLOAD).json() == protocol.simulation_failed_answer()
        assert stub.count == 1 and stats(server)["simulator"] == {"parse_retries": 0, "parse_retry_successes": 0}
        (record,) = list(layer.store)
        assert record.reason == "simulated: simulator output incomplete (finish_reason length)"


def test_a_cut_after_an_unparsable_output_ends_the_retries(mirror) -> None:
    with OpenAIStub(in_order(Reply(content="garbage"), Reply(content=CUT, finish_reason="length"), Reply(content=FULL))) as stub:
        server, layer, _ = mirror(stub.api_base, parse_retries=3, seed=7)
        assert server.post(PAYLOAD).json() == protocol.simulation_failed_answer()
        assert [r["seed"] for r in stub.requests] == [7, 8]
        (record,) = list(layer.store)
        assert record.reason == "simulated: simulator output incomplete (finish_reason length)"


def test_the_warning_names_the_api_and_the_finish_reason_and_redacts(mirror, caplog: pytest.LogCaptureFixture) -> None:
    echoed = json.dumps({"error": "", "response": f"my key is {API_KEY}"})
    with OpenAIStub(in_order(Reply(content=echoed, finish_reason="length"))) as stub:
        server, _, _ = mirror(stub.api_base)
        with caplog.at_level(logging.WARNING, logger="stabletoolbench_mirror"):
            assert server.post(PAYLOAD).json() == protocol.simulation_failed_answer()
    warnings = [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()]
    assert len(warnings) == 1 and API in warnings[0] and "finish_reason length" in warnings[0]
    assert API_KEY not in caplog.text and "my key is ***" in warnings[0]


def test_cache_ls_and_show_give_the_failure_and_its_cause(mirror, capsys: pytest.CaptureFixture[str]) -> None:
    with OpenAIStub(in_order(Reply(content=CUT, finish_reason="length"))) as stub:
        server, layer, settings = mirror(stub.api_base)
        assert server.post(PAYLOAD).json() == protocol.simulation_failed_answer()
    (record,) = list(layer.store)
    layer.close()
    store = ["--store-path", str(settings.resolve(settings.store.path))]
    capsys.readouterr()
    assert main(["cache", "ls", "--failures", "--json", *store]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (listed["api"], listed["key"], listed["outcome"]) == (API, record.key, "failure")
    assert main(["cache", "show", API, record.key, *store]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["reason"] == "simulated: simulator output incomplete (finish_reason length)"
    assert shown["answer"] == protocol.simulation_failed_answer()
