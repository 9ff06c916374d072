"""The HTTP transport's socket-free parts: the proxy chosen from the environment, requests refused before any
connection (moved from tests/integration/test_http_transport.py), and the in-memory double the unit tests run over
(tests.helpers.memory_transport)."""

from __future__ import annotations

import pytest

from stabletoolbench_mirror.responders import http_transport as ht
from tests.helpers import memory_transport as mt


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_the_memory_transport_hands_its_handler_the_request_with_the_options_headers_then_its_own() -> None:
    seen: list[mt.Request] = []

    def handler(request: mt.Request) -> ht.Reply:
        seen.append(request)
        return ht.Reply(201, {"x": "y"}, b"body")

    options = ht.TransportOptions(headers={"Authorization": "Bearer k", "Accept": "application/json"})
    factory = mt.MemoryTransport.factory(handler)
    a, b = factory("http://a.test/v1", options), factory("http://b.test/v1", options)
    assert a.post("/v1/x", b"1", {"Accept": "text/plain", "X-Extra": "1"}) == ht.Reply(201, {"x": "y"}, b"body")
    b.post("/v1/y", b"2")
    assert [(r.base, r.path, r.body) for r in seen] == [("http://a.test/v1", "/v1/x", b"1"), ("http://b.test/v1", "/v1/y", b"2")]
    assert seen[0].headers == {"Authorization": "Bearer k", "Accept": "text/plain", "X-Extra": "1"}
    assert seen[1].headers == {"Authorization": "Bearer k", "Accept": "application/json"}


def test_a_closed_memory_transport_cannot_connect_and_a_handlers_failure_comes_through() -> None:
    def handler(_request: mt.Request) -> ht.Reply:
        raise ht.BrokenAnswer("cut", status=200)

    transport = mt.MemoryTransport(handler)
    with pytest.raises(ht.BrokenAnswer) as caught:
        transport.post("/", b"")
    assert caught.value.status == 200
    transport.close()
    with pytest.raises(ht.ConnectFailed, match="closed"):
        transport.post("/", b"")


def test_the_failures_say_whether_they_timed_out() -> None:
    assert ht.ConnectFailed("x", timed_out=True).timed_out and not ht.ConnectFailed("x").timed_out
    assert ht.SendFailed("x", timed_out=True).timed_out and not ht.SendFailed("x").timed_out
    assert ht.BrokenAnswer("x").status is None
    assert all(issubclass(kind, ht.TransportError) for kind in (ht.ConnectFailed, ht.SendFailed, ht.AnswerTimedOut, ht.BrokenAnswer))


def test_no_proxy_in_the_environment_means_direct(no_proxy_env: pytest.MonkeyPatch) -> None:
    assert ht.proxy_for("http://127.0.0.1:8000/v1") is None
    no_proxy_env.setenv("ALL_PROXY", "proxy.example:3128")
    assert ht.proxy_for("https://model.example/v1") == "http://proxy.example:3128"
    no_proxy_env.setenv("NO_PROXY", "model.example")
    assert ht.proxy_for("https://model.example/v1") is None
    no_proxy_env.setenv("ALL_PROXY", "socks5://proxy.example:1080")
    with pytest.raises(ValueError, match="only http:// and https:// proxies"):
        ht.HttpcoreTransport("https://other.example/v1")


@pytest.mark.parametrize(
    ("env", "url", "proxy"),
    [
        ({"HTTP_PROXY": "http://p.test:8080"}, "http://model.test/v1", "http://p.test:8080"),
        ({"HTTP_PROXY": "http://p.test:8080"}, "https://model.test/v1", None),  # HTTP_PROXY is for http:// only
        ({"HTTPS_PROXY": "https://p.test:8443"}, "https://model.test/v1", "https://p.test:8443"),
        ({"https_proxy": "p.test:1"}, "https://model.test/v1", "http://p.test:1"),
        ({"HTTP_PROXY": "http://p.test", "NO_PROXY": ".model.test"}, "http://a.model.test/v1", None),
        ({"HTTP_PROXY": "http://p.test", "NO_PROXY": "*"}, "http://model.test/v1", None),
    ],
)
def test_the_proxy_requests_would_use(no_proxy_env: pytest.MonkeyPatch, env: dict[str, str], url: str, proxy: str | None) -> None:
    for name, value in env.items():
        no_proxy_env.setenv(name, value)
    assert ht.proxy_for(url) == proxy


def test_a_proxys_credentials_never_appear_in_its_refusal(no_proxy_env: pytest.MonkeyPatch) -> None:
    no_proxy_env.setenv("HTTPS_PROXY", "socks5://user:s3cret@proxy.example:1080")
    with pytest.raises(ValueError) as caught:
        ht.HttpcoreTransport("https://model.example/v1")
    assert "s3cret" not in str(caught.value) and "user" not in str(caught.value) and "proxy.example:1080" in str(caught.value)


def test_line_breaks_in_headers_or_path_are_refused(no_proxy_env: pytest.MonkeyPatch) -> None:
    options = ht.TransportOptions(headers={"Authorization": "Bearer k\r\nX-Injected: 1"})
    with pytest.raises(ValueError, match="line break"):
        ht.HttpcoreTransport("http://127.0.0.1:1/v1", options)
    transport = ht.HttpcoreTransport("http://127.0.0.1:1/v1")
    try:
        with pytest.raises(ValueError, match="not a request path"):
            transport.post("/v1/x HTTP/1.1\r\nX: y", b"")
    finally:
        transport.close()
