"""A small OpenAI-compatible chat-completions client (``requests``) for vLLM and friends.

One client serves every thread of the server: each endpoint has one pooled
:class:`requests.Session` (urllib3's pool is thread-safe; cookies are never kept), a
request goes to the next endpoint round robin or to the least busy one, and
connection errors, HTTP 5xx and 429 are retried a bounded number of times with
exponential backoff (a 429's ``Retry-After`` is honoured, capped).  A read timeout is
not retried: the server took the request and may still be working on it.
"""

from __future__ import annotations

import http.cookiejar
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import requests
import urllib3
from requests.adapters import HTTPAdapter

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
    tries: int = 1


class _RejectAll(http.cookiejar.CookiePolicy):
    netscape = True
    rfc2965 = hide_cookie2 = False

    def set_ok(self, cookie: Any, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Any, request: Any) -> bool:
        return False

    def domain_return_ok(self, domain: str, request: Any) -> bool:
        return False

    def path_return_ok(self, path: str, request: Any) -> bool:
        return False


class _Endpoint:
    def __init__(self, base: str, pool_size: int, headers: Mapping[str, str]) -> None:
        self.base = base.rstrip("/")
        self.url = self.base + "/chat/completions"
        self.in_flight = 0
        self.session = requests.Session()
        self.session.cookies.set_policy(_RejectAll())
        self.session.trust_env = False  # no proxies from the environment for a local model server
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool_size, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers.update(headers)


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
    ) -> None:
        bases = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not bases:
            raise ValueError("at least one endpoint is needed")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._endpoints = [_Endpoint(b, pool_size, headers) for b in bases]
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
        return [e.base for e in self._endpoints]

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
                return self._once(endpoint, data, attempt + 1)
            except ChatError as exc:
                last = exc
                log.info("simulator call to %s failed (try %d/%d): %s", endpoint.base, attempt + 1, self.max_retries + 1, exc.detail)
                if not exc.retryable:
                    break
            finally:
                self._release(endpoint)
        assert last is not None
        raise last

    def _once(self, endpoint: _Endpoint, data: bytes, tries: int) -> Completion:
        try:
            response = endpoint.session.post(endpoint.url, data=data, timeout=self.timeout, stream=True)
        except requests.exceptions.ReadTimeout:
            raise _error(f"no answer within {self.timeout[1]:g} s (read timeout)", endpoint, retryable=False) from None
        except requests.exceptions.ConnectTimeout:
            raise _error(f"connection timed out after {self.timeout[0]:g} s", endpoint, retryable=True) from None
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            raise _error(f"connection failed: {_short(exc)}", endpoint, retryable=True) from None
        except requests.exceptions.RequestException as exc:
            raise _error(f"request failed: {_short(exc)}", endpoint, retryable=False) from None
        try:
            try:
                raw = _read_capped(response)
            except requests.exceptions.RequestException as exc:
                if isinstance(exc, requests.exceptions.ReadTimeout) or (
                    exc.args and isinstance(exc.args[0], urllib3.exceptions.ReadTimeoutError)
                ):
                    raise _error(f"no answer within {self.timeout[1]:g} s (read timeout)", endpoint, retryable=False) from None
                raise _error(f"broken answer: {_short(exc)}", endpoint, retryable=True) from None
            except OSError as exc:
                raise _error(f"broken answer: {_short(exc)}", endpoint, retryable=True) from None
        finally:
            response.close()
        status = response.status_code
        if status != 200:
            raise ChatError(
                f"HTTP {status}: {_error_message(raw)}",
                endpoint=endpoint.base,
                status=status,
                retryable=status == 429 or status >= 500,
                retry_after=_retry_after(response.headers.get("Retry-After")) if status == 429 else None,
            )
        try:
            payload = json.loads(raw)
            choice = payload["choices"][0]
            content = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _error("the answer is not a chat completion", endpoint, retryable=False, status=status) from None
        if not isinstance(content, str):
            content = str(content)
        return Completion(
            content=content,
            finish_reason=str(choice.get("finish_reason") or ""),
            endpoint=endpoint.base,
            model=str(payload.get("model") or self.model),
            tries=tries,
        )

    def close(self) -> None:
        for endpoint in self._endpoints:
            endpoint.session.close()


def _error(detail: str, endpoint: _Endpoint, *, retryable: bool, status: int | None = None) -> ChatError:
    return ChatError(detail, endpoint=endpoint.base, status=status, retryable=retryable)


def _read_capped(response: requests.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=65536):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise requests.exceptions.ContentDecodingError(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _short(exc: BaseException) -> str:
    text = str(exc)
    # urllib3 messages repeat the pool's repr; the reason at the end is what matters
    if "Caused by" in text:
        text = text[text.index("Caused by") :]
    return text[:300]


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
