"""A real OpenAI-compatible chat-completions server on 127.0.0.1, scripted by tests and benchmarks.

It speaks the subset of the protocol vLLM's server offers that the simulator uses:
``POST /v1/chat/completions``, ``POST /v1/embeddings`` and ``GET /v1/models``.  Every
request body is recorded (embedding requests in ``embedding_requests``).  Chat behaviour
is scripted per request by a *responder* function that gets the decoded request body and
returns a :class:`Reply`:

* ``Reply(content="...")``: a normal completion whose message content is the text;
* ``Reply(status=500)`` / ``Reply(status=429)``: an error status with an OpenAI-style error body;
* ``Reply(delay_s=2.0, ...)``: answer after a delay (slow answers, timeouts);
* ``Reply(hang=True)``: accept the request and never answer (a hung socket);
* ``Reply(close=True)``: drop the connection without an answer;
* ``Reply(finish_reason="length")``: a completion that says why it ended (default ``stop``).

With ``with_headers=True`` the responder also gets the request's headers (e.g. to echo
``Authorization`` back, as some endpoints do).

Runs as a raw ASGI app under uvicorn, in a thread (tests) or its own process
(``python -m tests.helpers.openai_stub --port P --latency-ms 50`` for benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from tests.helpers.live import ScriptedApp, free_port, read_body, send_json


@dataclass
class Reply:
    content: str = '{"error": "", "response": "stub answer"}'
    status: int = 200
    delay_s: float = 0.0
    hang: bool = False
    close: bool = False
    finish_reason: str | None = "stop"
    """The choice's ``finish_reason`` (``"length"``, ``"content_filter"``, ...); ``None`` sends JSON ``null``."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers (e.g. ``(("Retry-After", "0.2"),)`` on a 429)."""
    message: str | None = None
    """The error message of a non-200 reply (default ``stub error <status>``)."""
    prompt_tokens: int = 1
    completion_tokens: int = 1
    """The ``usage`` a completion reports."""


Responder = Callable[[dict[str, Any]], Reply]
#: with ``OpenAIStub(..., with_headers=True)``: the body and the request headers (lower-case names)
HeaderResponder = Callable[[dict[str, Any], dict[str, str]], Reply]
Embedder = Callable[[str], list[float]]


def letter_embedder(text: str) -> list[float]:
    """A deterministic toy embedding: counts of the letters a-z and of everything else."""
    counts = [0.0] * 27
    for ch in text.lower():
        counts[ord(ch) - 97 if "a" <= ch <= "z" else 26] += 1.0
    return counts


def echo_responder(body: dict[str, Any]) -> Reply:
    """A valid MirrorAPI-style answer that quotes the last user message's length."""
    messages = body.get("messages") or [{}]
    text = str(messages[-1].get("content", ""))
    return Reply(content=json.dumps({"error": "", "response": f"simulated answer ({len(text)} chars of prompt)"}))


def echo_prompt_responder(body: dict[str, Any]) -> Reply:
    """A valid answer whose ``response`` is the last user message itself (tests check each answer's call)."""
    messages = body.get("messages") or [{}]
    return Reply(content=json.dumps({"error": "", "response": str(messages[-1].get("content", ""))}))


class OpenAIStub(ScriptedApp):
    """The stub server; use as a context manager, ``.api_base`` is the ``/v1`` URL."""

    def __init__(
        self,
        responder: Responder | HeaderResponder = echo_responder,
        *,
        port: int | None = None,
        model: str = "MirrorAPI",
        with_headers: bool = False,
        embedder: Embedder = letter_embedder,
        models: bool = True,
    ) -> None:
        """``models=False``: ``GET /v1/models`` is answered 404, as by OpenAI-compatible servers that have no models list."""
        self.responder = responder
        self.models = models
        self.with_headers = with_headers
        self.embedder = embedder
        self.embedding_requests: list[dict[str, Any]] = []
        self.model = model
        self.port = port or free_port()
        self.api_base = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()

    # -- ASGI ------------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/v1/models" and self.models:
            await send_json(send, 200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "stub"}]})
            return
        if method == "POST" and path == "/v1/embeddings":
            request = json.loads(body)
            with self._lock:
                self.embedding_requests.append(request)
            inputs = request["input"] if isinstance(request["input"], list) else [request["input"]]
            data = [{"object": "embedding", "index": i, "embedding": self.embedder(text)} for i, text in enumerate(inputs)]
            await send_json(send, 200, {"object": "list", "data": data, "model": request.get("model", self.model)})
            return
        if method != "POST" or path != "/v1/chat/completions":
            await send_json(send, 404, {"error": {"message": f"no route {method} {path}", "type": "NotFound"}})
            return
        try:
            request = json.loads(body)
        except ValueError:
            await send_json(send, 400, {"error": {"message": "body is not JSON", "type": "BadRequestError"}})
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            self.requests.append(request)
            self.headers.append(headers)
        reply = self.responder(request, headers) if self.with_headers else self.responder(request)  # type: ignore[call-arg]
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.hang:
            # never answer; the server's forced exit abandons the connection
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
            return
        if reply.close:
            # end the response without a body: the client sees a broken answer
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})
            await send({"type": "http.response.body", "body": b"{", "more_body": False})
            return
        if reply.status != 200:
            await send_json(
                send,
                reply.status,
                {"error": {"message": reply.message or f"stub error {reply.status}", "type": "ServerError", "code": reply.status}},
                reply.headers,
            )
            return
        await send_json(
            send,
            200,
            {
                "id": f"chatcmpl-stub-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.get("model", self.model),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": reply.finish_reason}
                ],
                "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                          "total_tokens": reply.prompt_tokens + reply.completion_tokens},
            },
        )

    # -- running ---------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)



def main() -> None:  # pragma: no cover - benchmark helper
    parser = argparse.ArgumentParser(description="OpenAI-compatible stub server for benchmarks")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--echo-prompt", action="store_true", help="answer with the last user message (echo_prompt_responder)")
    args = parser.parse_args()
    latency = args.latency_ms / 1000.0
    base = echo_prompt_responder if args.echo_prompt else echo_responder

    def responder(body: dict[str, Any]) -> Reply:
        reply = base(body)
        reply.delay_s = latency
        return reply

    stub = OpenAIStub(responder, port=args.port)
    uvicorn.run(stub, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="off")


if __name__ == "__main__":  # pragma: no cover
    main()
