"""An in-memory ``requests`` adapter: the real API's transport (``responders/real/transport.py``) without sockets."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers


@dataclass
class Canned:
    """One answer: its status, headers and body."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


Handler = Callable[[requests.PreparedRequest], Canned]


class MemoryAdapter(BaseAdapter):
    """Answers each request from ``handler`` (which may raise a ``requests`` exception); records what was sent."""

    def __init__(self, handler: Handler | Canned) -> None:
        super().__init__()
        self.handler: Handler = handler if callable(handler) else (lambda _request: handler)  # type: ignore[assignment,return-value]
        self.sent: list[requests.PreparedRequest] = []
        self.options: list[dict[str, Any]] = []
        self.closed = False

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None, verify: Any = True,
             cert: Any = None, proxies: Any = None) -> requests.Response:
        self.sent.append(request)
        self.options.append({"stream": stream, "timeout": timeout})
        canned = self.handler(request)
        response = requests.Response()
        response.status_code = canned.status
        response.headers = CaseInsensitiveDict(canned.headers)
        response.encoding = get_encoding_from_headers(response.headers)
        response.raw = io.BytesIO(canned.body)
        response.url = request.url or ""
        response.request = request
        response.reason = "memory"
        return response

    def close(self) -> None:
        self.closed = True
