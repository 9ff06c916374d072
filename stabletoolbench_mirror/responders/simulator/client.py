"""A small OpenAI-compatible chat-completions client for vLLM and friends.

It speaks HTTP through a :class:`~stabletoolbench_mirror.responders.http_transport.Transport` per
endpoint (httpcore's by default; ``transport_factory`` gives another, e.g. an in-memory one in
tests).  One client serves every thread of the server: each endpoint has one thread-safe pool of
kept-alive connections, a request goes to the next endpoint round robin or to the least busy one,
and connection and send errors, broken answers, HTTP 5xx and 429 are retried a bounded number of
times with exponential backoff (a 429's ``Retry-After`` is honoured, capped).  A read timeout (no
complete answer within ``read_timeout_s`` of the request, however slowly it trickles) is not
retried: the server took the request and may still be working on it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import urllib3

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.responders import http_transport as transport

log = logging.getLogger(__name__)

#: longest backoff between two tries, whatever ``Retry-After`` says
MAX_BACKOFF_S = 30.0
#: largest completion body read (a runaway server must not fill the memory)
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class ChatError(RuntimeError):
    """No completion: the endpoints failed, timed out or answered with an error."""

    def __init__(
        self,
        detail: str,
        *,
        endpoint: str = "",
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.endpoint = endpoint
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass(frozen=True)
class Completion:
    content: str
    finish_reason: str
    endpoint: str
    model: str
    """The model name the server reported (falls back to the requested one)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Endpoint:
    def __init__(self, base: str, factory: transport.TransportFactory, options: transport.TransportOptions) -> None:
        self.base = base.rstrip("/")
        parsed = urllib3.util.parse_url(self.base)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"not an http(s) URL: {_display(base)!r}")
        if parsed.auth:
            raise ValueError(f"credentials in the URL are not supported (use simulator.api_key): {_display(base)!r}")
        # a query string of the base (``?api-version=...``) goes after the route, not inside it
        self.path = (parsed.path or "").rstrip("/") + "/chat/completions" + (f"?{parsed.query}" if parsed.query else "")
        self.name = _display(self.base)
        """The endpoint for logs, stats and errors: no query string."""
        self.in_flight = 0
        # one transport (a pool of connections) per endpoint, shared by every thread
        self.transport = factory(self.base, options)


class ChatClient:
    """Chat completions against one or more OpenAI-compatible endpoints (``.../v1``)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        seed: int | None = None,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        balance: Literal["round_robin", "least_busy"] = "least_busy",
        pool_size: int = 64,
        transport_factory: transport.TransportFactory | None = None,
    ) -> None:
        bases = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not bases:
            raise ValueError("at least one endpoint is needed")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        self._redactor = Redactor([api_key] if api_key else [])
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        options = transport.TransportOptions(headers=headers, pool_size=pool_size, connect_timeout_s=connect_timeout_s,
                                             answer_timeout_s=read_timeout_s, max_answer_bytes=MAX_RESPONSE_BYTES,
                                             user_agent=f"stabletoolbench-mirror/{__version__}")
        factory = transport_factory or transport.HttpcoreTransport
        self._endpoints = [_Endpoint(b, factory, options) for b in bases]
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.timeout = (connect_timeout_s, read_timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.balance = balance
        self._lock = threading.Lock()
        self._next = 0

    @property
    def endpoints(self) -> list[str]:
        return [e.name for e in self._endpoints]

    # -- choosing an endpoint -----------------------------------------------------------------

    def _acquire(self, avoid: _Endpoint | None) -> _Endpoint:
        with self._lock:
            n = len(self._endpoints)
            order = [self._endpoints[(self._next + i) % n] for i in range(n)]
            self._next = (self._next + 1) % n
            if avoid is not None and n > 1:
                # a retry goes elsewhere first
                order = [e for e in order if e is not avoid] + [avoid]
            chosen = min(order, key=lambda e: e.in_flight) if self.balance == "least_busy" else order[0]
            chosen.in_flight += 1
            return chosen

    def _release(self, endpoint: _Endpoint) -> None:
        with self._lock:
            endpoint.in_flight -= 1

    # -- the request --------------------------------------------------------------------------

    def body(self, messages: Sequence[Mapping[str, str]], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON body of one chat-completions request."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if extra:
            body.update(extra)
        return body

    def complete(self, messages: Sequence[Mapping[str, str]], extra: Mapping[str, Any] | None = None) -> Completion:
        """One completion; raise :class:`ChatError` when every try failed."""
        data = json.dumps(self.body(messages, extra), ensure_ascii=False).encode("utf-8")
        last: ChatError | None = None
        previous: _Endpoint | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(MAX_BACKOFF_S, self.backoff_s * (2 ** (attempt - 1)))
                if last is not None and last.retry_after is not None:
                    delay = min(MAX_BACKOFF_S, max(delay, last.retry_after))
                if delay > 0:
                    time.sleep(delay)
            endpoint = self._acquire(previous)
            previous = endpoint
            try:
                return self._once(endpoint, data)
            except ChatError as exc:
                last = exc
                log.info("simulator call to %s failed (try %d/%d): %s", endpoint.name, attempt + 1, self.max_retries + 1, exc.detail)
                if not exc.retryable:
                    break
            finally:
                self._release(endpoint)
        assert last is not None
        raise last

    def _once(self, endpoint: _Endpoint, data: bytes) -> Completion:
        try:
            response = endpoint.transport.post(endpoint.path, data)
        except transport.TransportError as exc:
            raise self._failed(exc, endpoint) from None
        raw = response.body
        status = response.status
        if status != 200:
            raise ChatError(
                # an error body may echo the key back ("Incorrect API key provided: ...")
                self._redactor.text(f"HTTP {status}: {_error_message(raw)}"),
                endpoint=endpoint.name,
                status=status,
                retryable=status == 429 or status >= 500,
                retry_after=_retry_after(response.headers.get("retry-after")) if status == 429 else None,
            )
        try:
            payload = json.loads(raw)
            choice = payload["choices"][0]
            content = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _error("the answer is not a chat completion", endpoint, retryable=False, status=status) from None
        if not isinstance(content, str):
            content = str(content)
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        return Completion(
            content=content,
            finish_reason=str(choice.get("finish_reason") or ""),
            endpoint=endpoint.name,
            model=str(payload.get("model") or self.model),
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
        )

    def _failed(self, exc: transport.TransportError, endpoint: _Endpoint) -> ChatError:
        """The chat error of a try that got no answer."""
        if isinstance(exc, transport.AnswerTimedOut):
            # the server took the request and may still be working on it: not sent again
            return _error(f"no answer within {self.timeout[1]:g} s (read timeout)", endpoint, retryable=False)
        if isinstance(exc, transport.ConnectFailed) and exc.timed_out:
            return _error(f"connection timed out after {self.timeout[0]:g} s", endpoint, retryable=True)
        if isinstance(exc, (transport.ConnectFailed, transport.SendFailed)):
            # nothing of an answer came back (a send failure: the server does not have the request whole)
            return _error(f"connection failed: {_short(exc)}", endpoint, retryable=True)
        status = exc.status if isinstance(exc, transport.BrokenAnswer) else None
        return _error(f"broken answer: {_short(exc)}", endpoint, retryable=True, status=status)

    def close(self) -> None:
        for endpoint in self._endpoints:
            endpoint.transport.close()


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _error(detail: str, endpoint: _Endpoint, *, retryable: bool, status: int | None = None) -> ChatError:
    return ChatError(detail, endpoint=endpoint.name, status=status, retryable=retryable)


def _display(url: str) -> str:
    """``url`` without user info, query or fragment (safe to log)."""
    try:
        parsed = urllib3.util.parse_url(url)
    except (ValueError, urllib3.exceptions.LocationParseError):
        return "<unparsable URL>"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path or ''}"


def _short(exc: BaseException) -> str:
    return str(exc)[:300]


def _error_message(raw: bytes) -> str:
    try:
        data = json.loads(raw)
        message = data.get("error", {}).get("message") if isinstance(data.get("error"), dict) else data.get("message")
        if message:
            return str(message)[:300]
    except (ValueError, AttributeError):
        pass
    return raw[:300].decode("utf-8", "replace")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
