"""The real API's transport over an in-memory ``requests`` adapter: replies, failures, the answer bound and the breakers."""

from __future__ import annotations

import pytest
import requests

from stabletoolbench_mirror.responders.real.breaker import BreakerBoard
from stabletoolbench_mirror.responders.real.transport import Reply, Transport, host_key
from tests.helpers.memory_adapter import Canned, MemoryAdapter

URL = "https://api.example.test:8443/v1/items?x=1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def transport(adapter: MemoryAdapter, *, failures: int = 2, clock: Clock | None = None, max_answer_bytes: int = 1024) -> Transport:
    return Transport(connect_timeout_s=1.5, read_timeout_s=7.0, breakers=BreakerBoard(failures, 30.0, clock or Clock()),
                     max_answer_bytes=max_answer_bytes, adapter=adapter)


def raising(exc: Exception):
    def handler(_request: requests.PreparedRequest) -> Canned:
        raise exc

    return handler


def test_a_reply_carries_the_status_content_and_charset_and_the_request_is_sent_as_given() -> None:
    adapter = MemoryAdapter(Canned(201, "é".encode("latin-1"), {"Content-Type": "text/plain; charset=ISO-8859-1"}))
    t = transport(adapter)
    reply = t.send("POST", URL, headers={"X-RapidAPI-Key": "k"}, params={"q": "a b"}, json_body={"n": 1})
    assert (reply.ok, reply.status, reply.content, reply.encoding, reply.text()) == (True, 201, b"\xe9", "ISO-8859-1", "é")
    (sent,) = adapter.sent
    assert (sent.method, sent.url) == ("POST", "https://api.example.test:8443/v1/items?x=1&q=a+b")
    assert sent.headers["X-RapidAPI-Key"] == "k" and sent.body == b'{"n": 1}'
    assert adapter.options == [{"stream": True, "timeout": (1.5, 7.0)}]


def test_raw_data_is_sent_as_it_is() -> None:
    adapter = MemoryAdapter(Canned(200, b"{}"))
    transport(adapter).send("POST", URL, headers={}, data=b"\x00raw")
    assert adapter.sent[0].body == b"\x00raw"


def test_a_redirect_is_answered_not_followed() -> None:
    adapter = MemoryAdapter(Canned(302, b"", {"Location": "https://elsewhere.test/"}))
    reply = transport(adapter).send("GET", URL, headers={})
    assert reply.status == 302 and len(adapter.sent) == 1


@pytest.mark.parametrize(
    ("exc", "what"),
    [
        (requests.exceptions.ConnectTimeout(), "connect timed out"),
        (requests.exceptions.ReadTimeout(), "read timed out"),
        (requests.exceptions.Timeout(), "read timed out"),
        (requests.exceptions.ConnectionError("to https://api.example.test/?key=secret"), "connection failed"),
        (requests.exceptions.TooManyRedirects("https://x/?key=secret"), "request failed (TooManyRedirects)"),
        (requests.exceptions.ChunkedEncodingError("key=secret"), "request failed (ChunkedEncodingError)"),
    ],
)
def test_a_failure_is_a_fixed_phrase_naming_the_host_never_the_exceptions_text(exc: Exception, what: str) -> None:
    reply = transport(MemoryAdapter(raising(exc))).send("GET", URL, headers={})
    assert (reply.ok, reply.status, reply.content, reply.failure) == (False, 0, b"", f"api.example.test:8443: {what}")
    assert "secret" not in reply.failure


def test_an_answer_over_the_bound_is_refused_and_one_at_it_is_read() -> None:
    t = transport(MemoryAdapter(Canned(200, b"x" * 1025)), failures=1)
    reply = t.send("GET", URL, headers={})
    assert reply.failure == "answer larger than 1024 bytes" and reply.content == b""
    assert t.send("GET", URL, headers={}).failure == "answer larger than 1024 bytes"  # the host answered: not open (failures=1)
    assert transport(MemoryAdapter(Canned(200, b"x" * 1024))).send("GET", URL, headers={}).content == b"x" * 1024


def test_5xx_answers_and_failures_open_the_breaker_and_other_answers_close_it() -> None:
    clock = Clock()
    answers = [Canned(500), Canned(404), Canned(500)]
    calls: list[str] = []

    def handler(request: requests.PreparedRequest) -> Canned:
        calls.append(request.url or "")
        if answers:
            return answers.pop(0)
        raise requests.exceptions.ConnectionError()

    t = transport(MemoryAdapter(handler), failures=2, clock=clock)
    host = "api.example.test:8443"
    assert t.send("GET", URL, headers={}).status == 500
    assert t.send("GET", URL, headers={}).status == 404  # still closed (sent); alive: the count starts again
    assert t.send("GET", URL, headers={}).status == 500
    assert t.send("GET", URL, headers={}).failure == f"{host}: connection failed"
    refused = t.send("GET", URL, headers={})
    assert refused.failure == f"circuit open for {host}" and len(calls) == 4  # not sent
    # another host is not affected
    assert t.send("GET", "http://other.test/", headers={}).failure == "other.test: connection failed" and len(calls) == 5
    clock.now += 30
    assert t.send("GET", URL, headers={}).failure == f"{host}: connection failed"  # half open: the trial, sent, failed
    assert t.send("GET", URL, headers={}).failure == f"circuit open for {host}" and len(calls) == 6  # open again


def test_close_closes_the_adapter() -> None:
    adapter = MemoryAdapter(Canned())
    transport(adapter).close()
    assert adapter.closed


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://API.Example.test/x", "api.example.test"),
        ("http://h.test:8080/x?y", "h.test:8080"),
        ("https://user:pw@h.test/", "h.test"),
        ("https://[::1]:9/", "::1:9"),
        ("not a url", ""),
    ],
)
def test_host_key(url: str, key: str) -> None:
    assert host_key(url) == key


@pytest.mark.parametrize(
    ("content_type", "charset"),
    [
        ("application/json", None),
        ("application/json; charset=utf-8", "utf-8"),
        ('text/html; Charset="Shift_JIS"', "Shift_JIS"),
        ("text/plain; format=flowed; charset=latin-1", "latin-1"),
        ("text/plain; charset=", None),
        ("", None),
    ],
)
def test_the_charset_a_content_type_names_is_the_replys_encoding(content_type: str, charset: str | None) -> None:
    reply = transport(MemoryAdapter(Canned(200, b"{}", {"Content-Type": content_type}))).send("GET", URL, headers={})
    assert reply.encoding == charset  # no HTTP/1.1 latin-1 default: APIs send UTF-8


def test_text_falls_back_to_utf8_for_an_unknown_charset_and_replaces_bad_bytes() -> None:
    assert Reply(200, "é".encode(), "no-such-charset").text() == "é"
    assert Reply(200, b"\xff ok").text() == "\ufffd ok"
    assert not Reply(failure="x").ok and Reply(200).ok
