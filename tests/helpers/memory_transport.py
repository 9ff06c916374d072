"""An in-memory :class:`~stabletoolbench_mirror.responders.http_transport.Transport`: the model calls' transport
without sockets, for the unit tests of the chat client, the simulator responder and the model upstreams (the
transport itself is tested on real sockets in tests/integration/test_http_transport.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from stabletoolbench_mirror.responders.http_transport import ConnectFailed, Reply, TransportFactory, TransportOptions


@dataclass(frozen=True)
class Request:
    """What a :class:`MemoryTransport`'s handler gets."""

    base: str
    path: str
    body: bytes
    headers: Mapping[str, str]
    """The options' headers, then the request's own."""


class MemoryTransport:
    """Answers from ``handler`` (which may raise a :class:`~stabletoolbench_mirror.responders.http_transport.TransportError`): no sockets."""

    def __init__(self, handler: Callable[[Request], Reply], base: str = "memory://", options: TransportOptions | None = None) -> None:
        self.handler = handler
        self.base = base
        self.options = options or TransportOptions()
        self.closed = False

    @classmethod
    def factory(cls, handler: Callable[[Request], Reply]) -> TransportFactory:
        """A factory whose transports, one per endpoint, all answer from ``handler``."""
        return lambda base, options: cls(handler, base, options)

    def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None, *,
             answer_timeout_s: float | None = None) -> Reply:
        if self.closed:
            raise ConnectFailed("the transport is closed")
        return self.handler(Request(self.base, path, body, {**self.options.headers, **(headers or {})}))

    def close(self) -> None:
        self.closed = True
