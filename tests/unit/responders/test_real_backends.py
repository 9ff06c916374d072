"""The real-API side over the in-memory ``requests`` adapter: the relay's and RapidAPI's requests as sent, the call
policy, and the responder's validity rules and key scrubbing (no sockets)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.responders.real.breaker import BreakerBoard
from stabletoolbench_mirror.responders.real.policy import CallPolicy
from stabletoolbench_mirror.responders.real.rapidapi import RapidAPIBackend, answer_from_reply, build_request
from stabletoolbench_mirror.responders.real.relay import RelayBackend, relay_body, relay_tool_name
from stabletoolbench_mirror.responders.real.responder import RealResponder
from stabletoolbench_mirror.responders.real.transport import Reply, Transport
from tests.helpers.memory_adapter import Canned, MemoryAdapter

RELAY = "http://relay.test:8080/virtual?token=t0ps3cret"
KEY = "tb-key-0123456789"
RAPID_KEY = "rapid-key-0123456789"
DOC = {
    "name": "Get Order",
    "url": "https://orders.p.rapidapi.com/v1/orders/{id}",
    "method": "GET",
    "host": "orders.p.rapidapi.com",
    "required_parameters": [{"name": "id", "type": "STRING"}],
    "optional_parameters": [{"name": "Page-Size", "type": "NUMBER"}],
}


def json_reply(value: Any, status: int = 200) -> Canned:
    return Canned(status, json.dumps(value).encode())


def real_transport(adapter: MemoryAdapter) -> Transport:
    return Transport(connect_timeout_s=1, read_timeout_s=2, breakers=BreakerBoard(3, 30), adapter=adapter)


def call(tool_input: Any = None, **extra: str) -> ToolCall:
    return ToolCall.of("Commerce", "orders_for_Commerce", "Get Order", {"id": "7"} if tool_input is None else tool_input, **extra)


# -- the relay --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_name", "sent"),
    [("orders_for_Commerce", "orders"), ("orders", "orders"), ("a_for_b_for_c", "a"), ("_for_x", ""), ("for_x", "for_x")],
)
def test_the_relay_gets_the_tool_name_cut_at_the_first_for(tool_name: str, sent: str) -> None:
    assert relay_tool_name(tool_name) == sent


def test_the_relay_body_is_upstreams() -> None:
    assert relay_body(call(), KEY) == {"category": "Commerce", "tool_name": "orders", "api_name": "get_order",
                                       "tool_input": {"id": "7"}, "strip": "", "toolbench_key": KEY}


def test_a_relay_call_posts_the_body_with_the_requests_key_else_the_configured_one() -> None:
    adapter = MemoryAdapter(json_reply({"error": "", "response": "ok"}))
    backend = RelayBackend(real_transport(adapter), RELAY, default_key="configured")
    fetched = backend.fetch(call(toolbench_key=KEY))
    assert fetched.answer == {"error": "", "response": "ok"} and fetched.detail == ""
    assert fetched.origin == backend.origin and "t0ps3cret" not in fetched.origin
    backend.fetch(call())
    first, second = adapter.sent
    assert (first.method, first.url) == ("POST", RELAY)
    assert first.headers["toolbench_key"] == KEY and first.headers["Content-Type"] == "application/json"
    assert json.loads(first.body)["toolbench_key"] == KEY  # type: ignore[arg-type]
    assert second.headers["toolbench_key"] == "configured" and json.loads(second.body)["toolbench_key"] == "configured"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("canned", "detail"),
    [
        (json_reply({"error": "busy"}, 500), "relay: HTTP 500"),
        (json_reply({"error": "", "response": "x"}, 201), "relay: HTTP 201"),  # upstream looks at a 200 only
        (Canned(200, b"<html>oops</html>"), "relay: the answer is not JSON"),
        (Canned(200, b"[" * 100_000), "relay: the answer is not JSON"),
    ],
)
def test_a_relay_answer_upstream_would_not_take_is_no_answer(canned: Canned, detail: str) -> None:
    fetched = RelayBackend(real_transport(MemoryAdapter(canned)), RELAY).fetch(call())
    assert (fetched.answer, fetched.detail) == (None, detail)


def test_a_relay_that_cannot_be_reached_names_the_host_only() -> None:
    def down(_request: requests.PreparedRequest) -> Canned:
        raise requests.exceptions.ConnectionError(RELAY)

    fetched = RelayBackend(real_transport(MemoryAdapter(down)), RELAY, KEY).fetch(call())
    assert (fetched.answer, fetched.detail) == (None, "relay: relay.test:8080: connection failed")


# -- RapidAPI ---------------------------------------------------------------------------------------


def rapid(adapter: MemoryAdapter, doc: Mapping[str, Any] | None = DOC, base_url: str | None = None) -> RapidAPIBackend:
    return RapidAPIBackend(real_transport(adapter), lambda _call: doc, RAPID_KEY, base_url)


def test_a_rapidapi_call_is_built_from_the_doc_and_sent_with_the_key() -> None:
    adapter = MemoryAdapter(json_reply({"order": 7}))
    fetched = rapid(adapter).fetch(call({"is_id": "7/8", "page_size": 5}))
    assert fetched.answer == {"error": "", "response": {"order": 7}} and fetched.origin == "https://orders.p.rapidapi.com"
    (sent,) = adapter.sent
    parts = urlsplit(sent.url)
    assert (sent.method, parts.path, parse_qs(parts.query)) == ("GET", "/v1/orders/7%2F8", {"Page-Size": ["5"]})
    assert sent.headers["X-RapidAPI-Key"] == RAPID_KEY and sent.headers["X-RapidAPI-Host"] == "orders.p.rapidapi.com"


def test_a_rapidapi_post_sends_json_and_a_base_url_takes_the_host() -> None:
    adapter = MemoryAdapter(Canned(200, b"plain text", {"Content-Type": "text/plain"}))
    doc = dict(DOC, method="POST", url="https://orders.p.rapidapi.com/v1/orders")
    backend = rapid(adapter, doc, base_url="http://127.0.0.1:9999/prefix/")
    fetched = backend.fetch(call({"is_id": "7", "note": None}))
    assert fetched.answer == {"error": "", "response": "plain text"} and fetched.origin == "http://127.0.0.1:9999"
    (sent,) = adapter.sent
    assert (sent.url, json.loads(sent.body)) == ("http://127.0.0.1:9999/prefix/v1/orders", {"id": "7"})  # type: ignore[arg-type]
    assert sent.headers["X-RapidAPI-Host"] == "orders.p.rapidapi.com" and backend.origin == "http://127.0.0.1:9999"


@pytest.mark.parametrize(
    ("doc", "tool_input", "detail"),
    [
        (None, {"id": "7"}, "rapidapi: no tool doc for this API"),
        (DOC, {"page_size": 1}, "rapidapi: missing path parameter 'id'"),
        (DOC, ["not", "an", "object"], "rapidapi: the tool input is not a JSON object"),
        (dict(DOC, method="TRACE"), {"id": "7"}, "rapidapi: unsupported method 'TRACE'"),
        (dict(DOC, url="ftp://x/y"), {"id": "7"}, "rapidapi: the API doc's url is not an http(s) URL"),
    ],
)
def test_a_call_that_makes_no_request_sends_nothing(doc: Mapping[str, Any] | None, tool_input: Any, detail: str) -> None:
    adapter = MemoryAdapter(json_reply({}))
    fetched = rapid(adapter, doc).fetch(call(tool_input))
    assert (fetched.answer, fetched.detail, adapter.sent) == (None, detail, [])


@pytest.mark.parametrize(
    ("reply", "answer", "why"),
    [
        (Reply(200, b'{"a": 1}'), {"error": "", "response": {"a": 1}}, ""),
        (Reply(204, b""), {"error": "", "response": ""}, ""),
        (Reply(200, b"  \n"), {"error": "", "response": "  \n"}, ""),
        (Reply(200, b"[1, 2"), {"error": "", "response": "[1, 2"}, ""),
        (Reply(200, b'"text"'), {"error": "", "response": "text"}, ""),
        (Reply(302, b""), None, "HTTP 302"),
        (Reply(429, b'{"message": "slow down"}'), None, "HTTP 429"),
        (Reply(failure="h.test: read timed out"), None, "h.test: read timed out"),
    ],
)
def test_the_answer_of_a_hosts_reply(reply: Reply, answer: Any, why: str) -> None:
    assert answer_from_reply(reply) == (answer, why)


def test_a_list_argument_is_a_repeated_query_key_and_other_values_are_json_text() -> None:
    doc = dict(DOC, url="https://orders.p.rapidapi.com/v1/orders")
    built = build_request(doc, {"ids": [1, "2"], "flag": False, "filter": {"a": [1]}, "mixed": [1, {"b": 2}]})
    assert built.query == {"ids": ["1", "2"], "flag": "false", "filter": '{"a":[1]}', "mixed": '[1,{"b":2}]'}
    assert built.headers("") == {"X-RapidAPI-Host": "orders.p.rapidapi.com", "accept": "application/json"}


# -- the policy -------------------------------------------------------------------------------------

ALLOW_ALL = CallPolicy.of()


@pytest.mark.parametrize(
    ("policy", "category", "tool", "refusal"),
    [
        (ALLOW_ALL, "Video_Images", "t", ""),
        (CallPolicy.of(deny_categories=["Video/Images"]), "Video_Images", "t", "category denied by real.deny_categories"),
        (CallPolicy.of(deny_categories=[" video, images "]), "Video_Images", "t", "category denied by real.deny_categories"),
        (CallPolicy.of(deny_categories=["Video , Images"]), "Video_Images", "t", ""),  # upstream's one "__" -> "_" pass
        (CallPolicy.of(deny_categories=["video images"]), "Video_Images", "t", "category denied by real.deny_categories"),
        (CallPolicy.of(deny_tools=["My Tool"]), "Data", "my tool", "tool denied by real.deny_tools"),
        (CallPolicy.of(allow_categories=["Data"]), "Finance", "t", "category not in real.allow_categories"),
        (CallPolicy.of(allow_categories=["DATA"]), "data", "t", ""),
        (CallPolicy.of(allow_tools=["weather"]), "Data", "maps", "tool not in real.allow_tools"),
        (CallPolicy.of(allow_tools=["Weather API"]), "Data", "weather_api", ""),
        (CallPolicy.of(allow_categories=["Data"], deny_categories=["data"]), "Data", "t", "category denied by real.deny_categories"),
        (CallPolicy.of(allow_tools=["t"], deny_tools=["t"]), "Data", "t", "tool denied by real.deny_tools"),
        (CallPolicy.of(allow_categories=["Data"], allow_tools=["t"]), "Data", "u", "tool not in real.allow_tools"),
    ],
)
def test_the_policy_compares_standardised_names_and_a_deny_wins(policy: CallPolicy, category: str, tool: str, refusal: str) -> None:
    assert policy.refusal(ToolCall.of(category, tool, "api", {})) == refusal


# -- the responder ----------------------------------------------------------------------------------


def responder(canned: Canned, **options: Any) -> tuple[RealResponder, MemoryAdapter]:
    adapter = MemoryAdapter(canned)
    transport = real_transport(adapter)
    return RealResponder(RelayBackend(transport, RELAY, KEY), transport, **options), adapter


def test_a_valid_real_answer_is_returned_with_its_origin() -> None:
    real, _ = responder(json_reply({"error": "", "response": {"order": 7}}))
    attempt = real.respond(call(), ())
    assert (attempt.answer, attempt.origin, attempt.detail) == ({"error": "", "response": {"order": 7}}, real.backend.origin, "")


def test_a_refused_call_is_not_sent() -> None:
    real, adapter = responder(json_reply({"error": "", "response": "x"}), policy=CallPolicy.of(deny_categories=["Commerce"]))
    attempt = real.respond(call(), ())
    assert (attempt.answer, attempt.detail, adapter.sent) == (None, "not called: category denied by real.deny_categories", [])


@pytest.mark.parametrize(
    ("answer", "strict", "valid"),
    [
        ({"error": "", "response": "fine"}, False, True),
        ({"error": "Rate limit exceeded", "response": ""}, False, False),
        ({"error": "", "response": '{"message": "You are not authorized."}'}, False, False),
        ({"error": "", "response": {"status": "error", "message": "x"}}, True, False),
        ({"error": "", "response": {"status": "error", "message": "x"}}, False, True),
    ],
)
def test_only_answers_that_pass_the_validity_rules_are_returned(answer: Any, strict: bool, valid: bool) -> None:
    real, _ = responder(json_reply(answer), strict_validity=strict)
    attempt = real.respond(call(), ())
    assert (attempt.answer is not None) is valid
    assert valid or attempt.detail.startswith("invalid real answer: ")


def test_a_key_the_api_echoes_never_reaches_the_answer() -> None:
    echoed = {"error": "", "response": f"called with {KEY} and secret-setting-value and {RAPID_KEY}"}
    real, _ = responder(json_reply(echoed), secrets=["secret-setting-value"])
    attempt = real.respond(call(toolbench_key=RAPID_KEY), ())
    text = json.dumps(attempt.answer)
    assert attempt.answer is not None and "secret-setting-value" not in text and RAPID_KEY not in text
    assert attempt.answer["response"].startswith("called with ")


def test_no_answer_keeps_the_backends_detail_and_close_closes_the_transport() -> None:
    real, adapter = responder(json_reply({"error": "down"}, 503))
    attempt = real.respond(call(), ())
    assert (attempt.answer, attempt.origin, attempt.detail) == (None, real.backend.origin, "relay: HTTP 503")
    real.close()
    assert adapter.closed
