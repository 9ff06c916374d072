"""HTTP for real calls: one pooled ``requests`` session, bounded timeouts, per-host breakers.

Failures that count against a host's breaker: connection errors, timeouts and
HTTP 5xx answers.  Any other answer (even an error the validity rules reject)
shows the host is alive and closes its breaker.

Nothing here logs or returns request headers or bodies (they carry keys), nor
the text of ``requests`` exceptions (which quote URLs); failures are described
with fixed phrases.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter, HTTPAdapter

from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.responders.real.breaker import BreakerBoard

log = logging.getLogger(__name__)

#: the largest answer body read from a real API
MAX_ANSWER_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Reply:
    """A real host's HTTP answer (``status`` 0 and a ``failure`` when there is none)."""

    status: int = 0
    content: bytes = b""
    encoding: str | None = None
    failure: str = ""
    """Why there is no answer: ``circuit open``, ``timed out``, ``connection failed``, ..."""

    @property
    def ok(self) -> bool:
        return not self.failure

    def text(self) -> str:
        try:
            return self.content.decode(self.encoding or "utf-8", errors="replace")
        except LookupError:  # an unknown charset name
            return self.content.decode("utf-8", errors="replace")


def host_key(url: str) -> str:
    """The breaker key of a URL: ``host[:port]``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return host if parts.port is None else f"{host}:{parts.port}"


class Transport:
    """Sends real calls; thread-safe (one session, no cookies kept, per-call headers)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        breakers: BreakerBoard,
        pool_size: int = 64,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        adapter: BaseAdapter | None = None,
    ) -> None:
        """``adapter`` sends the requests (default: ``requests``' pooled HTTP one; tests give an in-memory one)."""
        self.timeout = (connect_timeout_s, read_timeout_s)
        self.breakers = breakers
        self.max_answer_bytes = max_answer_bytes
        self.session = requests.Session()
        # several threads share the session: never let one call's cookies reach another's
        self.session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
        if adapter is None:
            adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data: bytes | None = None,
    ) -> Reply:
        host = host_key(url)
        breaker = self.breakers.get(host)
        if not breaker.allow():
            return Reply(failure=f"circuit open for {host}")
        try:
            with self.session.request(
                method,
                url,
                headers=dict(headers),
                params=params,
                json=json_body,
                data=data,
                timeout=self.timeout,
                allow_redirects=False,
                stream=True,
            ) as response:
                content = self._read(response)
                status, encoding = response.status_code, _charset(response.headers.get("content-type", ""))
        except requests.exceptions.ConnectTimeout:
            return self._failed(breaker, host, "connect timed out")
        except (requests.exceptions.ReadTimeout, requests.exceptions.Timeout):
            return self._failed(breaker, host, "read timed out")
        except requests.exceptions.ConnectionError:
            return self._failed(breaker, host, "connection failed")
        except _TooLarge:
            breaker.success()
            return Reply(failure=f"answer larger than {self.max_answer_bytes} bytes")
        except requests.exceptions.RequestException as exc:
            return self._failed(breaker, host, f"request failed ({type(exc).__name__})")
        if status >= 500:
            breaker.failure()
        else:
            breaker.success()
        log.debug("real call %s %s -> HTTP %s (%d bytes)", method, public_url(url), status, len(content))
        return Reply(status=status, content=content, encoding=encoding)

    def _read(self, response: requests.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_content(chunk_size=65536):
            size += len(chunk)
            if size > self.max_answer_bytes:
                raise _TooLarge()
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _failed(breaker: Any, host: str, what: str) -> Reply:
        breaker.failure()
        log.debug("real call to %s: %s", host, what)
        return Reply(failure=f"{host}: {what}")

    def close(self) -> None:
        self.session.close()


class _TooLarge(Exception):
    pass


def _charset(content_type: str) -> str | None:
    """The charset a Content-Type names, if any (no HTTP/1.1 latin-1 default: APIs send UTF-8)."""
    for part in content_type.split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"')
    return None
