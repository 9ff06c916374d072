"""The chat client's tries, backoff, errors and redaction, over an in-memory transport (no sockets)."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator

import pytest

from stabletoolbench_mirror.responders import http_transport as ht
from stabletoolbench_mirror.responders.simulator import client as client_module
from stabletoolbench_mirror.responders.simulator.client import MAX_BACKOFF_S, ChatClient, ChatError
from tests.helpers import memory_transport as mt

MESSAGES = [{"role": "user", "content": "hi"}]
KEY = "sk-test-0123456789abcdef"


def completion(text: str = "ok", **extra: object) -> ht.Reply:
    payload = {"model": "served-model", "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}], **extra}
    return ht.Reply(200, {"content-type": "application/json"}, json.dumps(payload).encode())


def error(status: int, message: str = "nope", **headers: str) -> ht.Reply:
    return ht.Reply(status, headers, json.dumps({"error": {"message": message}}).encode())


class Script:
    """Answers (or raises) in the order given, recording each request."""

    def __init__(self, *steps: ht.Reply | Exception) -> None:
        self.steps = list(steps)
        self.requests: list[mt.Request] = []

    def __call__(self, request: mt.Request) -> ht.Reply:
        self.requests.append(request)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The client's backoff sleeps, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(sleep=slept.append))
    yield slept


def client_for(handler: Callable[[mt.Request], ht.Reply], endpoints: str | list[str] = "http://model.test/v1", **options: object) -> ChatClient:
    settings: dict = {"model": "m", "max_retries": 3, "backoff_s": 0.5, "transport_factory": mt.MemoryTransport.factory(handler)}
    settings.update(options)
    return ChatClient(endpoints, **settings)


def test_a_completion_is_parsed_and_the_request_is_the_chat_body() -> None:
    script = Script(completion("hello", usage={"prompt_tokens": 3, "completion_tokens": 2}))
    result = client_for(script, api_key=KEY, seed=7).complete(MESSAGES, {"response_format": {"type": "json_object"}})
    assert (result.content, result.finish_reason, result.model) == ("hello", "stop", "served-model")
    assert (result.prompt_tokens, result.completion_tokens, result.endpoint) == (3, 2, "http://model.test/v1")
    (request,) = script.requests
    assert (request.base, request.path) == ("http://model.test/v1", "/v1/chat/completions")
    assert request.headers["Authorization"] == f"Bearer {KEY}" and request.headers["Content-Type"] == "application/json"
    assert json.loads(request.body) == {"model": "m", "messages": MESSAGES, "temperature": 0.0, "max_tokens": 2048, "seed": 7,
                                        "response_format": {"type": "json_object"}}


def test_server_errors_are_retried_with_exponential_backoff(sleeps: list[float]) -> None:
    script = Script(error(500), error(503), error(502), completion())
    assert client_for(script).complete(MESSAGES).content == "ok" and len(script.requests) == 4
    assert sleeps == [0.5, 1.0, 2.0]


def test_when_every_try_fails_the_last_error_is_raised(sleeps: list[float]) -> None:
    script = Script(*[error(500, f"down {i}") for i in range(4)])
    with pytest.raises(ChatError, match="HTTP 500: down 3") as caught:
        client_for(script).complete(MESSAGES)
    assert (caught.value.status, caught.value.retryable, caught.value.endpoint) == (500, True, "http://model.test/v1")
    assert len(script.requests) == 4 and sleeps == [0.5, 1.0, 2.0]


def test_backoff_is_capped(sleeps: list[float]) -> None:
    script = Script(*[error(500)] * 8, completion())
    client_for(script, max_retries=8, backoff_s=10.0).complete(MESSAGES)
    assert sleeps == [10.0, 20.0] + [MAX_BACKOFF_S] * 6


def test_a_429_waits_its_retry_after_within_the_cap(sleeps: list[float]) -> None:
    script = Script(error(429, **{"retry-after": "4"}), error(429, **{"retry-after": "999"}), error(429), completion())
    client_for(script).complete(MESSAGES)
    assert sleeps == [4.0, MAX_BACKOFF_S, 2.0]


def test_a_client_error_is_not_retried(sleeps: list[float]) -> None:
    script = Script(error(400, "bad request"))
    with pytest.raises(ChatError, match="HTTP 400: bad request") as caught:
        client_for(script).complete(MESSAGES)
    assert not caught.value.retryable and len(script.requests) == 1 and sleeps == []


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (ht.ConnectFailed("cannot connect to model.test:80: [Errno 111] Connection refused"), "connection failed: cannot connect to .*refused"),
        (ht.ConnectFailed("connection to model.test:80 timed out", timed_out=True), "connection timed out after 3 s"),
        (ht.SendFailed("sending the request timed out after 120 s", timed_out=True), "connection failed: sending the request timed out"),
        (ht.SendFailed("sending the request failed: [Errno 32] Broken pipe"), "connection failed: sending the request failed"),
        (ht.BrokenAnswer("the server closed the connection before the answer was complete"), "broken answer: .*before the answer was complete"),
    ],
)
def test_transport_failures_before_an_answer_are_retried(sleeps: list[float], failure: Exception, message: str) -> None:
    script = Script(failure, completion("second"))
    assert client_for(script).complete(MESSAGES).content == "second"
    script = Script(*[failure] * 4)
    with pytest.raises(ChatError, match=message) as caught:
        client_for(script).complete(MESSAGES)
    assert caught.value.retryable and len(script.requests) == 4


def test_a_read_timeout_is_not_retried(sleeps: list[float]) -> None:
    script = Script(ht.AnswerTimedOut("no answer within 120 s"), completion())
    with pytest.raises(ChatError, match=r"no answer within 120 s \(read timeout\)") as caught:
        client_for(script).complete(MESSAGES)
    assert not caught.value.retryable and len(script.requests) == 1 and sleeps == []


def test_a_broken_answer_keeps_its_status(sleeps: list[float]) -> None:
    script = Script(ht.BrokenAnswer("the server switched protocols (HTTP 101) instead of answering", status=101))
    with pytest.raises(ChatError, match="broken answer: the server switched protocols") as caught:
        client_for(script, max_retries=0).complete(MESSAGES)
    assert caught.value.status == 101


def test_an_answer_that_is_no_completion_is_not_retried(sleeps: list[float]) -> None:
    script = Script(ht.Reply(200, {}, b'{"choices": []}'))
    with pytest.raises(ChatError, match="not a chat completion") as caught:
        client_for(script).complete(MESSAGES)
    assert (caught.value.status, caught.value.retryable, len(script.requests)) == (200, False, 1)


def test_a_key_echoed_in_an_error_is_redacted(sleeps: list[float]) -> None:
    script = Script(error(401, f"Incorrect API key provided: {KEY}"))
    with pytest.raises(ChatError) as caught:
        client_for(script, api_key=KEY).complete(MESSAGES)
    assert KEY not in str(caught.value) and KEY not in caught.value.detail
    assert "HTTP 401: Incorrect API key provided" in caught.value.detail


def test_a_retry_goes_to_another_endpoint_first(sleeps: list[float]) -> None:
    # another call meanwhile takes the next endpoint in turn, so the turn is back at the one that failed
    bases: list[str] = []

    def handler(request: mt.Request) -> ht.Reply:
        bases.append(request.base)
        if len(bases) == 1:
            client.complete(MESSAGES)
            return error(500)
        return completion()

    client = client_for(handler, ["http://a.test/v1", "http://b.test/v1"], balance="round_robin")
    assert client.complete(MESSAGES).endpoint == "http://b.test/v1"
    assert bases == ["http://a.test/v1", "http://b.test/v1", "http://b.test/v1"]


def test_round_robin_takes_the_endpoints_in_turn() -> None:
    script = Script(*[completion()] * 4)
    client = client_for(script, ["http://a.test/v1", "http://b.test/v1"], balance="round_robin")
    assert [client.complete(MESSAGES).endpoint for _ in range(4)] == ["http://a.test/v1", "http://b.test/v1"] * 2


def test_close_closes_every_transport() -> None:
    transports: list[mt.MemoryTransport] = []

    def factory(base: str, options: ht.TransportOptions) -> ht.Transport:
        made = mt.MemoryTransport(Script(), base, options)
        transports.append(made)
        return made

    client = ChatClient(["http://a.test/v1", "http://b.test/v1"], model="m", read_timeout_s=7.0, pool_size=5, transport_factory=factory)
    assert [(t.base, t.options.answer_timeout_s, t.options.pool_size) for t in transports] == [
        ("http://a.test/v1", 7.0, 5), ("http://b.test/v1", 7.0, 5)]
    assert transports[0].options.max_answer_bytes == client_module.MAX_RESPONSE_BYTES
    client.close()
    assert all(t.closed for t in transports)


def test_credentials_in_an_endpoint_url_are_refused() -> None:
    with pytest.raises(ValueError, match="credentials in the URL"):
        client_for(Script(), "http://user:secret@model.test/v1")


@pytest.mark.parametrize(
    ("choice", "content", "finish_reason"),
    [
        ({"message": {"content": "text"}, "finish_reason": "length"}, "text", "length"),
        ({"message": {"content": None}, "finish_reason": "tool_calls"}, "", "tool_calls"),
        ({"message": {}}, "", ""),
        ({"message": {"content": ["a", 1]}, "finish_reason": None}, "['a', 1]", ""),
        ({"message": {"content": 42}, "finish_reason": 7}, "42", "7"),
    ],
)
def test_a_completions_content_and_finish_reason_are_taken_as_sent(choice: dict, content: str, finish_reason: str) -> None:
    answer = ht.Reply(200, {}, json.dumps({"choices": [choice]}).encode())
    result = client_for(Script(answer)).complete(MESSAGES)
    assert (result.content, result.finish_reason, result.model) == (content, finish_reason, "m")  # no model named: the one asked for


@pytest.mark.parametrize(
    ("usage", "counts"),
    [
        ({"prompt_tokens": 0, "completion_tokens": 5}, (0, 5)),
        ({"prompt_tokens": -1, "completion_tokens": True}, (None, None)),
        ({"prompt_tokens": "3", "completion_tokens": 2.0}, (None, None)),
        ("not an object", (None, None)),
        (None, (None, None)),
    ],
)
def test_token_counts_are_kept_only_when_they_are_counts(usage: object, counts: tuple[int | None, int | None]) -> None:
    result = client_for(Script(completion(usage=usage))).complete(MESSAGES)
    assert (result.prompt_tokens, result.completion_tokens) == counts


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"error": {"message": "model not found"}}', "HTTP 404: model not found"),
        (b'{"message": "top-level message"}', "HTTP 404: top-level message"),
        (b'{"error": "a plain string"}', 'HTTP 404: {"error": "a plain string"}'),
        (b"<html>Not Found</html>", "HTTP 404: <html>Not Found</html>"),
        (b"\xff\xfe broken", "HTTP 404: \ufffd\ufffd broken"),
        (b"x" * 1000, "HTTP 404: " + "x" * 300),
    ],
)
def test_an_error_names_the_servers_message_cut_short(body: bytes, detail: str) -> None:
    with pytest.raises(ChatError) as caught:
        client_for(Script(ht.Reply(404, {}, body))).complete(MESSAGES)
    assert caught.value.detail == detail and caught.value.status == 404


@pytest.mark.parametrize(("retry_after", "slept"), [("2.5", 2.5), ("soon", 0.5), ("-3", 0.5), ("", 0.5)])
def test_a_429s_retry_after_is_read_when_it_is_a_number(sleeps: list[float], retry_after: str, slept: float) -> None:
    client_for(Script(error(429, **{"retry-after": retry_after}), completion())).complete(MESSAGES)
    assert sleeps == [slept]


def test_a_retry_after_on_a_5xx_is_not_waited_for(sleeps: list[float]) -> None:
    client_for(Script(error(503, **{"retry-after": "20"}), completion())).complete(MESSAGES)
    assert sleeps == [0.5]


def test_no_retries_means_one_try_and_no_backoff_means_no_sleep(sleeps: list[float]) -> None:
    script = Script(error(500), error(500))
    with pytest.raises(ChatError):
        client_for(script, max_retries=0).complete(MESSAGES)
    assert len(script.requests) == 1
    client_for(Script(error(500), completion()), backoff_s=0).complete(MESSAGES)
    assert sleeps == []


def test_least_busy_takes_the_endpoint_with_the_fewest_calls_in_flight() -> None:
    bases: list[str] = []

    def handler(request: mt.Request) -> ht.Reply:
        bases.append(request.base)
        if len(bases) == 1:  # a.test is busy with this call while two more come
            client.complete(MESSAGES)
            client.complete(MESSAGES)
        return completion()

    client = client_for(handler, ["http://a.test/v1", "http://b.test/v1"], balance="least_busy")
    client.complete(MESSAGES)
    assert bases == ["http://a.test/v1", "http://b.test/v1", "http://b.test/v1"]


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [("ftp://model.test/v1", "not an http"), ("model.test/v1", "not an http"), ("http:///v1", "not an http")],
)
def test_an_endpoint_that_is_no_http_url_is_refused(endpoint: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        client_for(Script(), endpoint)
    with pytest.raises(ValueError, match="at least one endpoint"):
        client_for(Script(), [])


def test_an_endpoints_trailing_slash_is_dropped_and_its_path_kept() -> None:
    script = Script(completion())
    client = client_for(script, "http://model.test:8000/prefix/v1/")
    assert client.endpoints == ["http://model.test:8000/prefix/v1"]
    result = client.complete(MESSAGES)
    assert result.endpoint == "http://model.test:8000/prefix/v1" and script.requests[0].path == "/prefix/v1/chat/completions"


@pytest.mark.parametrize(("base", "path"), [
    ("http://model.test/v1", "/v1/chat/completions"),
    ("http://model.test/v1/", "/v1/chat/completions"),
    ("http://model.test", "/chat/completions"),
    ("https://model.test/openai/v1?api-version=2024-06-01", "/openai/v1/chat/completions?api-version=2024-06-01"),
])
def test_the_route_goes_before_the_base_s_query_string(base: str, path: str) -> None:
    script = Script(completion())
    client_for(script, endpoints=base).complete(MESSAGES)
    assert script.requests[0].path == path
