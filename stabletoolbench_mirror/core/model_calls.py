"""What a recorded model call is: its API name, its key, its answer, written once.

The agent's and the judge's model calls are recorded in the same store as tool answers, as ordinary
:class:`~stabletoolbench_mirror.core.records.Record` s.  Two **endpoints** (:class:`Endpoint`) are
answered, each decides its API name, its route (under ``/v1`` and under an upstream's base URL), what
a request must hold and what an answer must be, and the shape of its streamed events: chat completions
(:data:`CHAT`, ``POST /v1/chat/completions``, the ``messages`` of a chat) and text completions
(:data:`TEXT`, ``POST /v1/completions``, the ``prompt`` of ToolLLaMA served by vLLM).

* the **API** of a model's records is ``@model/<model>/chat_completions`` or ``@model/<model>/completions``
  (:func:`model_api`).
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
  every secret the upstream echoed masked (:class:`~.secrets.Redactor`, as for tool answers), and only
  when it is one (:meth:`Endpoint.answer_problem`); a streamed request is served as server-sent events
  built from it (:meth:`Endpoint.events`).

Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: the category of every model API: never a StableToolBench category (``/virtual`` refuses it)
MODEL_CATEGORY = "@model"
#: the API name of a chat completion under its model's folder
CHAT_COMPLETIONS = "chat_completions"
#: the API name of a text completion under its model's folder
COMPLETIONS = "completions"
#: request fields that change how an answer is carried, not what it is: never part of the key.
#: ``stream`` and ``stream_options``: the upstream is always asked for the whole completion and a
#: streamed request gets it as events; ``user``: an end-user id for the vendor's abuse checks.
OUT_OF_KEY = frozenset({"stream", "stream_options", "user"})
#: the longest model name accepted (a folder name of a snapshot)
MAX_MODEL_CHARS = 200
#: a control character (C0, DEL, C1): never in a model name
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def model_api(model: str, endpoint: str = CHAT_COMPLETIONS) -> str:
    """The API name under which ``model``'s calls of ``endpoint`` (:attr:`Endpoint.name`) are recorded."""
    return f"{MODEL_CATEGORY}/{model}/{endpoint}"


def model_endpoint(api: str) -> tuple[str, str] | None:
    """``(model, endpoint)`` of ``@model/<model>/<endpoint>`` (a model may hold ``/``); ``None`` for a tool's API."""
    if not api.startswith(MODEL_CATEGORY + "/"):
        return None
    model, _, endpoint = api[len(MODEL_CATEGORY) + 1:].rpartition("/")
    return (model, endpoint) if model and endpoint else None


def model_of(api: str) -> str | None:
    """The model of a model API of either endpoint this server answers (``None`` for a tool's API or another endpoint)."""
    parts = model_endpoint(api)
    return parts[0] if parts is not None and parts[1] in (CHAT_COMPLETIONS, COMPLETIONS) else None


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


_DECODER = json.JSONDecoder(parse_float=_number)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_request(raw: bytes | str) -> Any:
    """A request body as JSON, an integral number written as a float (``0.0``, ``1e3``) read as the integer:
    ``temperature: 0.0`` and ``temperature: 0`` are one request (and are sent upstream as the integer).

    A UTF-8 body is read by one decoder made once; any other (UTF-16, a BOM) as ``json.loads`` reads it."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return json.loads(raw, parse_float=_number)
        if text.startswith("\ufeff"):
            return json.loads(raw, parse_float=_number)  # json.loads' own error for a BOM
        return _DECODER.decode(text)
    return json.loads(raw, parse_float=_number)


def canonical_request(body: Mapping[str, Any]) -> str:
    """The request's canonical JSON (of a body read by :func:`parse_request`): what its key is made of."""
    kept = {k: v for k, v in body.items() if k not in OUT_OF_KEY} if not OUT_OF_KEY.isdisjoint(body) else body
    return _CANONICAL.encode(kept)


#: a string longer than this is escaped in pieces by :func:`json_parts`
PIECE_CHARS = 1 << 16
#: an object or array of at most this many plain values (no container, no string over :data:`PIECE_CHARS`) is one piece
SMALL_ITEMS = 64
#: consecutive small items of an array written in one piece (a few hundred microseconds of C)
BATCH_ITEMS = 256
_escape = json.encoder.encode_basestring
_ENCODE = {sort_keys: json.JSONEncoder(sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode
           for sort_keys in (False, True)}


def _plain(value: Any) -> bool:
    return not isinstance(value, (dict, list)) and (not isinstance(value, str) or len(value) <= PIECE_CHARS)


def _small(value: Any) -> bool:
    """Whether ``value`` is written in one C call that takes no time worth splitting."""
    if isinstance(value, str):
        return len(value) <= PIECE_CHARS
    if isinstance(value, dict):
        return len(value) <= SMALL_ITEMS and all(map(_plain, value.values()))
    if isinstance(value, list):
        return len(value) <= SMALL_ITEMS and all(map(_plain, value))
    return True


def json_parts(value: Any, sort_keys: bool) -> Iterator[str]:
    """``json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False)``, the same text, in pieces.

    For a large body in a worker thread: ``json.dumps`` is one C call that holds the GIL for all of it (115 ms
    for a 15.6 MiB string, 175 ms for 110,000 messages), so the event loop would stop that long; here a long
    string is escaped :data:`PIECE_CHARS` characters at a time, an array's small items :data:`BATCH_ITEMS` at a
    time, and the GIL is free between pieces (about twice the CPU of one call).  Values as
    :func:`parse_request` makes them (string keys).
    """
    if _small(value):
        yield _ENCODE[sort_keys](value)
    elif isinstance(value, str):
        yield '"'
        for start in range(0, len(value), PIECE_CHARS):
            yield _escape(value[start:start + PIECE_CHARS])[1:-1]
        yield '"'
    elif isinstance(value, dict):
        separator = "{"
        for key, item in sorted(value.items()) if sort_keys else value.items():
            yield separator + _escape(key) + ":"
            yield from json_parts(item, sort_keys)
            separator = ","
        yield "}"
    else:
        yield from _array_parts(value, sort_keys)


def _array_parts(items: list[Any], sort_keys: bool) -> Iterator[str]:
    separator, batch = "[", []
    for item in items:
        if _small(item):
            batch.append(item)
            if len(batch) < BATCH_ITEMS:
                continue
        if batch:
            yield separator + _ENCODE[sort_keys](batch)[1:-1]
            separator, batch = ",", []
        if not _small(item):
            yield separator
            yield from json_parts(item, sort_keys)
            separator = ","
    if batch:
        yield separator + _ENCODE[sort_keys](batch)[1:-1]
    yield "]"


def json_bytes(value: Any, large: bool) -> bytes:
    """``value`` as compact JSON in UTF-8 (``large``: in pieces, :func:`json_parts`, for a worker thread)."""
    if not large:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return b"".join(part.encode("utf-8") for part in json_parts(value, sort_keys=False))


def canonical_digest(body: Mapping[str, Any]) -> tuple[str, int]:
    """``(sha256, size)`` of :func:`canonical_request`'s UTF-8, computed in pieces (:func:`json_parts`; a large body in a
    worker thread).  ``UnicodeEncodeError`` for a lone surrogate."""
    digest, size = hashlib.sha256(), 0
    for part in json_parts({k: v for k, v in body.items() if k not in OUT_OF_KEY}, sort_keys=True):
        data = part.encode("utf-8")
        digest.update(data)
        size += len(data)
    return digest.hexdigest(), size


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


#: the most tokens one figure of an answer's ``usage`` may say: a larger one is no count (read as 0, see :func:`usage_of`)
MAX_USAGE_TOKENS = 100_000_000
#: a request's prompt tokens are estimated from its canonical JSON's size at this many bytes a token (about 4 in
#: English text; JSON's quotes and braces make it an over-estimate), for the token budget (:func:`token_estimate`)
BYTES_PER_TOKEN = 4
#: the completion tokens estimated for a request that names no ``max_tokens`` (or ``max_completion_tokens``)
COMPLETION_ESTIMATE = 1024


def usage_of(completion: Mapping[str, Any]) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of a completion (0 where it says nothing, or nothing that can be a count:
    not an integer, negative, or above :data:`MAX_USAGE_TOKENS`)."""
    usage = completion.get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0

    def number(name: str) -> int:
        value = usage.get(name)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_USAGE_TOKENS
        return value if ok else 0  # type: ignore[return-value]

    return number("prompt_tokens"), number("completion_tokens")


def token_estimate(body: Mapping[str, Any], canonical_bytes: int) -> int:
    """The tokens a request may cost at most, as the budget reserves them before asking: its prompt (its canonical
    JSON's size over :data:`BYTES_PER_TOKEN`) plus ``max_tokens`` (or ``max_completion_tokens``; else
    :data:`COMPLETION_ESTIMATE`) for each of its ``n`` choices."""
    completion = COMPLETION_ESTIMATE
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_USAGE_TOKENS:
            completion = value
            break
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
    return canonical_bytes // BYTES_PER_TOKEN + 1 + completion * choices


def _chunk(completion: Mapping[str, Any], kind: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": completion.get("id", "cmpl-recorded"),
        "object": kind,
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


@dataclass(frozen=True)
class Endpoint:
    """One kind of model call: its API name, its route, what a request and an answer hold, its streamed events.

    :data:`CHAT` (``/chat/completions``: ``messages``, each choice a ``message``) and :data:`TEXT`
    (``/completions``: ``prompt``, each choice a ``text``); the same rules of keys, occurrences and
    records apply to both.
    """

    name: str
    """The last part of its API name (:func:`model_api`): ``chat_completions`` or ``completions``."""
    path: str
    """Its route under ``/v1`` and under an upstream's base URL."""
    prompt: str
    """The request field that holds what is asked: ``messages`` (a list) or ``prompt`` (a string or a list)."""
    answer: str
    """What each choice of an answer holds: ``message`` (an object) or ``text`` (a string)."""
    chunk: str
    """The ``object`` of its streamed chunks."""

    def api(self, model: str) -> str:
        return model_api(model, self.name)

    def request_problem(self, body: Any) -> str | None:
        """Why a request body is not a request of this endpoint that can be keyed (``None``: it is)."""
        if not isinstance(body, dict):
            return f"the request body must be a JSON object (a request of POST /v1{self.path})"
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return "the request has no model (a string is required)"
        if len(model) > MAX_MODEL_CHARS or _CONTROL.search(model):
            return f"the model name is over {MAX_MODEL_CHARS} characters or holds control characters"
        asked = body.get(self.prompt)
        if self.prompt == "messages" and not isinstance(asked, list):
            return "the request has no messages (a list is required)"
        if self.prompt == "prompt" and not (isinstance(asked, str) or isinstance(asked, list) and asked):
            return "the request has no prompt (a string, or a list of strings or of token ids, is required)"
        return None

    def answer_problem(self, completion: Any) -> str | None:
        """Why an upstream's HTTP 200 body is not an answer of this endpoint (``None``: it is one, to record).

        An answer has at least one choice, each an object holding its ``message`` object (chat) or its
        ``text`` string; a body with a non-null ``error`` is the upstream's failure, whatever else it holds.
        """
        if not isinstance(completion, dict):
            return "not a JSON object"
        if completion.get("error") is not None:
            return "it holds an error object"
        choices = completion.get("choices")
        if not isinstance(choices, list) or not choices:
            return "it has no choices"
        for choice in choices:
            if not isinstance(choice, dict):
                return "a choice is not an object"
            if self.answer == "message" and not isinstance(choice.get("message"), dict):
                return "a choice has no message object"
            if self.answer == "text" and not isinstance(choice.get("text"), str):
                return "a choice has no text"
        return None

    def events(self, completion: Mapping[str, Any], include_usage: bool) -> Iterator[bytes]:
        """A whole answer as the server-sent events of a streamed one (the ``openai`` SDK's ``stream=True``).

        One chunk carries each choice's whole message as its delta (role, content, tool calls with
        their ``index``) or its whole text, the next its ``finish_reason`` (and a chat choice's
        ``logprobs``); with ``stream_options.include_usage`` a last chunk carries ``usage`` with no
        choices; then ``[DONE]``.  For an answer :meth:`answer_problem` accepts.
        """
        choices = [c for c in completion.get("choices") or () if isinstance(c, Mapping)]
        first, last = [], []
        for i, c in enumerate(choices):
            index = c.get("index", i)
            end: dict[str, Any] = {"index": index}
            if self.answer == "message":
                first.append({"index": index, "delta": _delta(c.get("message") or {}), "finish_reason": None})
                end.update(delta={}, finish_reason=c.get("finish_reason"))
                if c.get("logprobs") is not None:
                    end["logprobs"] = c["logprobs"]
            else:  # a text completion's chunk: the text, with its logprobs
                first.append({"index": index, "text": c.get("text", ""), "logprobs": c.get("logprobs"), "finish_reason": None})
                end.update(text="", logprobs=None, finish_reason=c.get("finish_reason"))
            last.append(end)
        parts = [_chunk(completion, self.chunk, first), _chunk(completion, self.chunk, last)]
        if include_usage and completion.get("usage") is not None:
            parts.append(_chunk(completion, self.chunk, [], usage=completion["usage"]))
        for part in parts:
            yield b"data: " + json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"
        yield b"data: [DONE]\n\n"


#: chat completions (``POST /v1/chat/completions``): the agent of ``chatgpt_function`` and the judge
CHAT = Endpoint(CHAT_COMPLETIONS, "/chat/completions", "messages", "message", "chat.completion.chunk")
#: text completions (``POST /v1/completions``): ToolLLaMA served by vLLM (``--backbone_model toolllama_vllm``)
TEXT = Endpoint(COMPLETIONS, "/completions", "prompt", "text", "text_completion")
#: every endpoint, by its route under ``/v1``
ENDPOINTS: dict[str, Endpoint] = {"/v1" + e.path: e for e in (CHAT, TEXT)}

