"""Direct RapidAPI calls built from tool docs, checked by what a real 127.0.0.1 host received."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.responders.real import build_real_responder
from tests.conftest import make_settings
from tests.helpers.api_host import ApiHost, HostReply, Received

KEY = "rapid-key-for-tests-0001"
TOOL_DOC = {
    "tool_name": "Demo Orders",
    "standardized_name": "demo_orders",
    "host": "demo-orders.p.rapidapi.com",
    "api_list": [
        {
            "name": "Get Order",
            "url": "https://demo-orders.p.rapidapi.com/v1/orders/{id}",
            "method": "GET",
            "required_parameters": [{"name": "id", "type": "STRING", "description": "", "default": ""}],
            "optional_parameters": [{"name": "Page-Size", "type": "NUMBER", "description": "", "default": "10"}],
        },
        {
            "name": "Create Order",
            "url": "https://demo-orders.p.rapidapi.com/v1/orders",
            "method": "POST",
            "required_parameters": [{"name": "from", "type": "STRING"}, {"name": "item", "type": "STRING"}],
            "optional_parameters": [{"name": "Gift-Wrap", "type": "BOOLEAN"}],
        },
        {"name": "Motto", "url": "https://demo-orders.p.rapidapi.com/motto", "method": "GET", "required_parameters": [], "optional_parameters": []},
        {"name": "Missing", "url": "https://demo-orders.p.rapidapi.com/gone", "method": "GET", "required_parameters": [], "optional_parameters": []},
    ],
}


def host_script(received: Received) -> HostReply:
    if received.path.startswith("/v1/orders/"):
        return HostReply(body={"order": received.path.rsplit("/", 1)[1], "items": [1, 2], "note": None})
    if received.path == "/v1/orders":
        return HostReply(status=201, body={"created": True})
    if received.path == "/motto":
        return HostReply(body="Keep calm and cache on", content_type="text/plain")
    return HostReply(status=404, body={"message": "Endpoint '/gone' does not exist"})


@pytest.fixture
def rapid(tmp_path: Path):
    tools = tmp_path / "tools" / "Commerce"
    tools.mkdir(parents=True)
    (tools / "demo_orders.json").write_text(json.dumps(TOOL_DOC))
    with ApiHost(host_script) as host:
        settings = make_settings(
            tmp_path,
            tools_folder=str(tmp_path / "tools"),
            real={"enabled": True, "backend": "rapidapi", "rapidapi_key": KEY, "rapidapi_base_url": host.url},
        )
        layer = build_layer(settings)
        yield settings, layer, host
        layer.close()


def call(api: str, tool_input: Any) -> dict[str, Any]:
    return {"category": "Commerce", "tool_name": "Demo Orders", "api_name": api, "tool_input": json.dumps(tool_input), "strip": "", "toolbench_key": ""}


def test_get_fills_path_and_query_with_the_docs_names(rapid, serve) -> None:
    settings, layer, host = rapid
    server = serve(settings, layer)
    r = server.post(call("Get Order", {"is_id": "A/42", "page_size": 5}))
    assert r.headers["X-STM-Source"] == "real"
    # the JSON answer is kept as returned
    assert r.json() == {"error": "", "response": {"order": "A%2F42", "items": [1, 2], "note": None}}
    sent = host.last
    assert sent.method == "GET"
    assert sent.path == "/v1/orders/A%2F42"
    assert sent.query == {"Page-Size": ["5"]}
    assert sent.headers["x-rapidapi-key"] == KEY
    assert sent.headers["x-rapidapi-host"] == "demo-orders.p.rapidapi.com"
    assert sent.body == b""
    record = layer.store.get(ToolCall.of("Commerce", "Demo Orders", "Get Order", {"is_id": "A/42", "page_size": 5}).api, "{'is_id': 'A/42', 'page_size': 5}")
    assert record is not None and record.source == "real" and record.origin == host.url


def test_post_sends_a_json_body(rapid, serve) -> None:
    settings, layer, host = rapid
    server = serve(settings, layer)
    r = server.post(call("Create Order", {"is_from": "Paris", "item": "book", "gift_wrap": True}))
    assert r.headers["X-STM-Source"] == "real"
    assert r.json() == {"error": "", "response": {"created": True}}
    sent = host.last
    assert sent.method == "POST" and sent.path == "/v1/orders" and sent.raw_query == ""
    assert sent.headers["content-type"] == "application/json"
    assert sent.json() == {"from": "Paris", "item": "book", "Gift-Wrap": True}
    assert sent.headers["x-rapidapi-key"] == KEY


def test_text_answers_are_kept_as_text(rapid, serve) -> None:
    settings, layer, host = rapid
    server = serve(settings, layer)
    r = server.post(call("Motto", {}))
    assert r.json() == {"error": "", "response": "Keep calm and cache on"}


def test_host_errors_and_unbuildable_calls_are_recorded_only_as_failures(rapid, serve) -> None:
    settings, layer, host = rapid
    server = serve(settings, layer)
    r = server.post(call("Missing", {}))
    assert r.headers["X-STM-Outcome"] == "failed" and r.json()["error"] == protocol.MISS_ERROR
    assert host.count == 1
    # no id for the path: nothing is sent
    r = server.post(call("Get Order", {"page_size": 1}))
    assert r.headers["X-STM-Outcome"] == "failed"
    # an API the docs do not know
    r = server.post(call("Unknown API", {}))
    assert r.headers["X-STM-Outcome"] == "failed"
    assert host.count == 1
    # what the client got is recorded as failure records, never as a real answer
    assert len(layer.store) == 3 and all(r.is_failure and r.source == "real" for r in layer.store)
    failures = layer.stats.snapshot()["failures"]
    assert "real: rapidapi: HTTP 404" in failures
    assert "real: rapidapi: missing path parameter 'id'" in failures
    assert "real: rapidapi: no tool doc for this API" in failures


def test_rapidapi_needs_a_tools_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tools_folder"):
        build_real_responder(Settings(real={"enabled": True, "backend": "rapidapi"}))



def test_a_fuzzy_doc_match_never_spends_the_key(rapid, serve) -> None:
    """'Get Ordr' resembles 'Get Order' (the simulator may use that doc) but no real call goes out."""
    settings, layer, host = rapid
    server = serve(settings, layer)
    r = server.post(call("Get Ordr", {"is_id": "7"}))
    assert r.json()["error"] == "API not working error..."
    assert host.received == []

