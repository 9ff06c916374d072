"""What a recorded model call is: its API name, its key, its answer, written once.

The agent's and the judge's chat completions (``POST /v1/chat/completions``) are recorded in the
same store as tool answers, as ordinary :class:`~stabletoolbench_mirror.core.records.Record` s:

* the **API** of a model's records is ``@model/<model>/chat_completions`` (:func:`model_api`).
  ``@model`` is no StableToolBench category (``/virtual`` refuses it), so tool answers and model
  answers never share a name, and a model's records travel wherever an API's do: ``snapshot``
  (as ``@model/<model>/chat_completions.json`` in the tree), frozen caches, ``cache import``,
  ``cache ls --source model``, ``cache diff``, the content hash;
* the **key** is ``<digest>#<occurrence>`` (:func:`record_key`): ``digest`` is the SHA-256 of the
  request's canonical JSON (:func:`canonical_request`: keys sorted, no whitespace, an integral
  float read as the integer by :func:`parse_request`, the transport fields of :data:`OUT_OF_KEY` left out), and
  ``occurrence`` counts identical requests within one run (1, 2, ...), so the n-th identical
  request of a run gets the n-th recorded answer;
* the **body** is the completion as the upstream sent it, in compact JSON with its own key order,
  every secret the upstream echoed masked (:class:`~.secrets.Redactor`, as for tool answers); a
  streamed request is served as server-sent events built from it (:func:`sse_events`).

Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

#: the category of every model API: never a StableToolBench category (``/virtual`` refuses it)
MODEL_CATEGORY = "@model"
#: the API name of a chat completion under its model's folder
CHAT_COMPLETIONS = "chat_completions"
#: request fields that change how an answer is carried, not what it is: never part of the key.
#: ``stream`` and ``stream_options``: the upstream is always asked for the whole completion and a
#: streamed request gets it as events; ``user``: an end-user id for the vendor's abuse checks.
OUT_OF_KEY = frozenset({"stream", "stream_options", "user"})
#: the longest model name accepted (a folder name of a snapshot)
MAX_MODEL_CHARS = 200


def model_api(model: str) -> str:
    """The API name under which ``model``'s chat completions are recorded."""
    return f"{MODEL_CATEGORY}/{model}/{CHAT_COMPLETIONS}"


def is_model_api(api: str) -> bool:
    return api.startswith(MODEL_CATEGORY + "/")


def model_of(api: str) -> str | None:
    """The model of a model API (``None`` for a tool's API)."""
    if not is_model_api(api) or not api.endswith("/" + CHAT_COMPLETIONS):
        return None
    return api[len(MODEL_CATEGORY) + 1 : -len(CHAT_COMPLETIONS) - 1]


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def parse_request(raw: bytes | str) -> Any:
    """A request body as JSON, an integral number written as a float (``0.0``, ``1e3``) read as the integer:
    ``temperature: 0.0`` and ``temperature: 0`` are one request (and are sent upstream as the integer)."""
    return json.loads(raw, parse_float=_number)


def canonical_request(body: Mapping[str, Any]) -> str:
    """The request's canonical JSON (of a body read by :func:`parse_request`): what its key is made of."""
    kept = {k: v for k, v in body.items() if k not in OUT_OF_KEY}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_digest(body: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of :func:`canonical_request`: the key of every occurrence of this request."""
    return hashlib.sha256(canonical_request(body).encode("utf-8", "surrogatepass")).hexdigest()


def record_key(digest: str, occurrence: int) -> str:
    return f"{digest}#{occurrence}"


def split_key(key: str) -> tuple[str, int] | None:
    """``(digest, occurrence)`` of a model record's key, ``None`` if it is not one."""
    digest, sep, number = key.rpartition("#")
    if not sep or len(digest) != 64 or not number.isdigit():
        return None
    return digest, int(number)


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), as the ``openai`` SDK reads it."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage_of(completion: Mapping[str, Any]) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of a completion (0 where it says nothing)."""
    usage = completion.get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0

    def number(name: str) -> int:
        value = usage.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return number("prompt_tokens"), number("completion_tokens")


def _chunk(completion: Mapping[str, Any], choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": completion.get("id", "chatcmpl-recorded"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model", ""),
    }
    if "system_fingerprint" in completion:
        chunk["system_fingerprint"] = completion["system_fingerprint"]
    chunk["choices"] = choices
    chunk.update(extra)
    return chunk


def _delta(message: Mapping[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": message.get("role", "assistant")}
    for name, value in message.items():
        if name == "role":
            continue
        if name == "tool_calls" and isinstance(value, list):
            delta["tool_calls"] = [{"index": i, **call} if isinstance(call, dict) else call for i, call in enumerate(value)]
        else:
            delta[name] = value
    return delta


def sse_events(completion: Mapping[str, Any], include_usage: bool) -> Iterator[bytes]:
    """A whole completion as the server-sent events of a streamed one (the ``openai`` SDK's ``stream=True``).

    One chunk carries each choice's whole message as its delta (role, content, tool calls with
    their ``index``), the next its ``finish_reason`` (and ``logprobs``); with
    ``stream_options.include_usage`` a last chunk carries ``usage`` with no choices; then ``[DONE]``.
    """
    choices = [c for c in completion.get("choices") or () if isinstance(c, Mapping)]
    first = [{"index": c.get("index", i), "delta": _delta(c.get("message") or {}), "finish_reason": None}
             for i, c in enumerate(choices)]
    last = []
    for i, c in enumerate(choices):
        end: dict[str, Any] = {"index": c.get("index", i), "delta": {}, "finish_reason": c.get("finish_reason")}
        if c.get("logprobs") is not None:
            end["logprobs"] = c["logprobs"]
        last.append(end)
    parts = [_chunk(completion, first), _chunk(completion, last)]
    if include_usage and completion.get("usage") is not None:
        parts.append(_chunk(completion, [], usage=completion["usage"]))
    for part in parts:
        yield b"data: " + json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"
    yield b"data: [DONE]\n\n"
