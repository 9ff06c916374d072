"""An AGENT and a JUDGE: real OpenAI-compatible chat servers on 127.0.0.1 for StableToolBench's own code.

Both answer ``POST /v1/chat/completions`` (JSON, or server-sent events with ``"stream": true`` as the
openai SDK reads them: a role chunk, content and tool-call deltas, a chunk with ``finish_reason``,
a ``usage`` chunk when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``) and
``GET /v1/models``.  Every answer carries ``id``, ``created``, ``model``, ``system_fingerprint``,
``usage`` and the choice's ``finish_reason``.  Each request's body and headers are kept
(``requests``, ``headers``; ``count``).

* :class:`AgentStub` plays the model of ``qa_pipeline.py --backbone_model chatgpt_function``
  (:func:`agent_message`): offered ``tools`` and no tool result yet, it calls one of them (the first
  that is not ``Finish``) with arguments derived from the query; once a tool result is in the
  conversation it calls ``Finish`` with ``{"return_type": "give_answer", "final_answer": ...}`` as
  upstream's prompts ask.  The answer is a function of the request only (tool-call ids included), so
  the same conversation always gets the same answer, byte for byte.
* :class:`ToolLlamaStub` plays ToolLLaMA v2 served by vLLM (``qa_pipeline.py --backbone_model toolllama_vllm``),
  which calls ``POST /v1/completions`` with the whole ReAct prompt (:func:`toolllama_text`): it answers
  ``Thought: ...\nAction: <function>\nAction Input: {...}`` as upstream's ``react_parser`` reads it, a call of the
  first function the system prompt offers until a ``Function:`` (tool) turn is in the prompt, then ``Finish``.
  A function of the request only.
* :class:`JudgeStub` plays the model of ``eval_pass_rate.py`` (:func:`judge_arguments`): upstream's
  evaluators call it with one function in ``tools`` and ``tool_choice`` naming it
  (``check_answer_status``, ``parse_answer_status``, ``check_task_solvable``, ``select_better_answer``,
  the normalized evaluator's ``check_solve_query``/``select_best_final_answer``/``parse_answer_details``;
  the legacy ``functions`` + ``function_call`` of ``tooleval_gpt-3.5-turbo_fn`` too) and parse
  ``choices[0].message.tool_calls[0].function.arguments``.  Its label (``Solved``/``Unsolved``) is a
  function of the request at ``temperature`` 0 and a draw of a seeded ``random.Random`` per request
  at ``temperature`` > 0 (``random_above_zero=False`` makes it deterministic at any temperature).
  Upstream's default evaluator (``tooleval_gpt-3.5-turbo_default``) sends ``temperature: 0.2``.

Both can be told to fail (:meth:`ChatStub.fail`: a status with an OpenAI error body, e.g. 500 or 429
with ``Retry-After``) and to echo the request's ``Authorization`` value in what they answer
(``echo_key=True``: in the message content, for secret tests).  Note that the openai SDK retries a
429/5xx itself (``max_retries`` 2 by default), so one failing call from upstream is up to three
requests here.

Use as context managers; ``.api_base`` is the ``/v1`` URL::

    with AgentStub() as agent, JudgeStub(seed=7) as judge:
        run_qa_pipeline(agent.api_base, ...); run_eval_pass_rate(judge.api_base, ...)
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.scoring.demo_models import arguments_for, forced_function, offered_functions, user_query
from tests.helpers.live import ScriptedApp, free_port, read_body, send_json

FINISH = "Finish"
LABELS = ("Solved", "Unsolved")


@dataclass
class Failure:
    """What :meth:`ChatStub.fail` makes the stub answer instead of a completion."""

    status: int = 500
    message: str | None = None
    times: int | None = None
    """How many requests fail (``None``: all, until :meth:`ChatStub.recover`)."""
    retry_after: float | None = None
    """Sent as ``Retry-After`` (seconds), e.g. with a 429."""


@dataclass
class Answer:
    """One assistant message as a stub produces it (before it is put in a completion or a stream)."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    function_call: dict[str, str] | None = None
    finish_reason: str = "stop"


def _digest(data: Any, n: int = 24) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()[:n]


def _count_tokens(text: str) -> int:
    return max(1, len(text.split()))


class ChatStub(ScriptedApp):
    """The common server: routes, counting, failures, JSON and SSE answers; subclasses write :meth:`answer`."""

    default_model = "gpt-stub"

    def __init__(self, *, port: int | None = None, echo_key: bool = False, model: str | None = None) -> None:
        self.port = port or free_port()
        self.api_base = f"http://127.0.0.1:{self.port}/v1"
        self.echo_key = echo_key
        self.model = model or self.default_model
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.failed = 0
        """How many requests got a :class:`Failure` answer."""
        self._failure: Failure | None = None
        self._lock = threading.Lock()

    # -- what a test sets ------------------------------------------------------------------------

    def fail(self, status: int = 500, *, times: int | None = None, message: str | None = None, retry_after: float | None = None) -> None:
        """Answer the next ``times`` requests (all when ``None``) with ``status`` and an OpenAI error body."""
        with self._lock:
            self._failure = Failure(status, message, times, retry_after)

    def recover(self) -> None:
        """Answer normally again."""
        with self._lock:
            self._failure = None

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.headers.clear()
            self.failed = 0

    # -- what a subclass writes ------------------------------------------------------------------

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> Answer:  # pragma: no cover - abstract
        raise NotImplementedError

    def text(self, body: dict[str, Any], headers: dict[str, str]) -> str | None:
        """The text completion of ``body`` (``POST /v1/completions``); ``None``: no such route (HTTP 404)."""
        return None

    def _echo(self, headers: dict[str, str]) -> str:
        return f" [authorization: {headers.get('authorization', '')}]" if self.echo_key else ""

    # -- ASGI ------------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        path, method = scope["path"].rstrip("/"), scope["method"]
        if method == "GET" and path == "/v1/models":
            models = [{"id": self.model, "object": "model", "created": 0, "owned_by": "stub"}]
            await send_json(send, 200, {"object": "list", "data": models})
            return
        text_route = method == "POST" and path == "/v1/completions"
        if not text_route and (method != "POST" or path != "/v1/chat/completions"):
            await send_json(send, 404, _error_body(f"no route {method} {path}", "not_found_error", 404))
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("prompt" if text_route else "messages"), (str, list)):
                raise ValueError("prompt missing" if text_route else "messages missing")
        except ValueError as exc:
            await send_json(send, 400, _error_body(f"bad request: {exc}", "invalid_request_error", 400))
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            number = len(self.requests)
            failure = self._failure
            if failure is not None:
                self.failed += 1
                if failure.times is not None:
                    failure.times -= 1
                    if failure.times <= 0:
                        self._failure = None
        if failure is not None:
            extra = (("retry-after", f"{failure.retry_after:g}"),) if failure.retry_after is not None else ()
            kind = "rate_limit_error" if failure.status == 429 else "server_error"
            error = _error_body(failure.message or f"stub error {failure.status}", kind, failure.status)
            await send_json(send, failure.status, error, extra)
            return
        if text_route:
            await self._send_text(send, body, headers, number)
            return
        answer = self.answer(body, headers)
        completion_id = f"chatcmpl-stub-{number}"
        model = str(body.get("model") or self.model)
        prompt_tokens = _count_tokens(json.dumps(body.get("messages"), ensure_ascii=False))
        completion_tokens = _count_tokens(json.dumps([answer.content, answer.tool_calls, answer.function_call], ensure_ascii=False))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await _send_stream(send, completion_id, model, answer, usage if include_usage else None)
            return
        reply: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            reply["tool_calls"] = answer.tool_calls
        if answer.function_call is not None:
            reply["function_call"] = answer.function_call
        await send_json(
            send,
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "system_fingerprint": "fp_stub",
                "choices": [{"index": 0, "message": reply, "logprobs": None, "finish_reason": answer.finish_reason}],
                "usage": usage,
            },
        )

    async def _send_text(self, send: Any, body: dict[str, Any], headers: dict[str, str], number: int) -> None:
        text = self.text(body, headers)
        if text is None:
            await send_json(send, 404, _error_body("no route POST /v1/completions", "not_found_error", 404))
            return
        prompt_tokens = _count_tokens(json.dumps(body.get("prompt"), ensure_ascii=False))
        completion_tokens = _count_tokens(text)
        await send_json(send, 200, {
            "id": f"cmpl-stub-{number}", "object": "text_completion", "created": int(time.time()),
            "model": str(body.get("model") or self.model),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    # -- running ---------------------------------------------------------------------------------


# -- the agent ---------------------------------------------------------------------------------------


def derive_arguments(function: dict[str, Any], query: str) -> dict[str, Any]:
    """Arguments for ``function`` taken from the query: demo_models' (each required parameter's ``example_value``,
    else a few words of the query, numbers 1, booleans true), and the first required string parameter met before any
    string value gets the query's first quoted phrase (``'birthday party ideas'``) when it has one."""
    arguments = arguments_for(function, query)
    quoted = re.findall(r"'([^']{2,80})'|\"([^\"]{2,80})\"", query)
    phrase = next((a or b for a, b in quoted), None)
    properties: dict[str, Any] = (function.get("parameters") or {}).get("properties") or {}
    for name, value in arguments.items():  # in the order of the required parameters
        spec = properties[name] if isinstance(properties[name], dict) else {}
        if phrase is not None and spec.get("type", "string") == "string":
            arguments[name] = phrase
            break
        if isinstance(value, str):
            break
    return arguments


Chooser = Callable[[list[dict[str, Any]], str], dict[str, Any]]
"""``choose(functions, query)``: the function (of those offered, ``Finish`` left out) the agent calls next."""


def agent_message(body: dict[str, Any], *, tool_calls_before_answer: int = 1, choose: Chooser | None = None) -> Answer:
    """What the agent answers to ``body`` (a pure function of it).

    ``tool_choice`` ``"none"`` (or no tools): a text answer.  A forced function: a call to it.  Otherwise,
    until ``tool_calls_before_answer`` tool results are in the conversation, a call to the next offered
    function that is not ``Finish`` (``choose(functions, query)`` picks another); then ``Finish``
    ``give_answer`` with a final answer quoting the query and the last tool result.
    """
    messages = body.get("messages") or []
    functions = offered_functions(body)
    query = user_query(messages)
    results = [m for m in messages if m.get("role") in ("tool", "function")]
    legacy = not body.get("tools") and bool(body.get("functions"))
    if not functions or body.get("tool_choice") == "none" or body.get("function_call") == "none":
        return Answer(content=f"Answer to: {query[:200]}", finish_reason="stop")
    names = [f.get("name") for f in functions]
    forced = forced_function(body)
    workers = [f for f in functions if f.get("name") != FINISH]
    if forced is not None and forced in names:
        function = functions[names.index(forced)]
        content = None
    elif workers and len(results) < tool_calls_before_answer:
        function = choose(workers, query) if choose else workers[len(results) % len(workers)]
        content = f"I will call {function.get('name')} to help with the query."
    elif FINISH in names:
        function = functions[names.index(FINISH)]
        content = None
    else:
        return Answer(content=f"Answer to: {query[:200]}", finish_reason="stop")
    if function.get("name") == FINISH:
        seen = str(results[-1].get("content") or "")[:300] if results else "no tool result"
        arguments: dict[str, Any] = {"return_type": "give_answer", "final_answer": f"Answer to: {query[:200]} -- from the tools: {seen}"}
    else:
        arguments = derive_arguments(function, query)
    text = json.dumps(arguments, ensure_ascii=False)
    name = str(function.get("name"))
    if legacy:
        return Answer(content=content, function_call={"name": name, "arguments": text}, finish_reason="function_call")
    call = {"id": "call_" + _digest([messages, name]), "type": "function", "function": {"name": name, "arguments": text}}
    return Answer(content=content, tool_calls=[call], finish_reason="tool_calls")


class AgentStub(ChatStub):
    """The agent model (see :func:`agent_message`); ``tool_calls_before_answer`` tool calls, then ``Finish``."""

    default_model = "gpt-3.5-turbo-16k-0613"

    def __init__(
        self,
        *,
        tool_calls_before_answer: int = 1,
        choose: Chooser | None = None,
        port: int | None = None,
        echo_key: bool = False,
        model: str | None = None,
    ) -> None:
        super().__init__(port=port, echo_key=echo_key, model=model)
        self.tool_calls_before_answer = tool_calls_before_answer
        self.choose = choose

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> Answer:
        answer = agent_message(body, tool_calls_before_answer=self.tool_calls_before_answer, choose=self.choose)
        if self.echo_key:
            answer.content = (answer.content or "") + self._echo(headers)
        return answer


# -- ToolLLaMA (text completions) --------------------------------------------------------------------

#: what upstream's ``process_system_message`` puts before the functions' list in ToolLLaMA's system prompt
_APIS_MARK = "Specifically, you have access to the following APIs: "


def _offered(prompt: str) -> list[dict[str, Any]]:
    """The functions ToolLLaMA's prompt offers: the list after :data:`_APIS_MARK` (Python's ``str`` of a list of dicts)."""
    start = prompt.find(_APIS_MARK)
    if start < 0:
        return []
    rest = prompt[start + len(_APIS_MARK):]
    end = rest.find("\nUser:")
    try:
        offered = ast.literal_eval(rest[:end] if end >= 0 else rest.split("\n", 1)[0])
    except (ValueError, SyntaxError):
        return []
    return [f for f in offered if isinstance(f, dict)] if isinstance(offered, list) else []


def toolllama_text(prompt: str) -> str:
    """ToolLLaMA's answer to ``prompt`` (``System: ...\nUser: ...\n...Assistant:\n``), in the ReAct format upstream's
    ``react_parser`` reads: a call of the first offered function that is not ``Finish`` with arguments derived
    from the query, until a ``Function:`` turn (a tool's result) is in the prompt; then ``Finish`` ``give_answer``."""
    query = ""
    for line in prompt.split("\n"):
        if line.startswith("User: "):
            query = line[len("User: "):].strip() or query
    workers = [f for f in _offered(prompt) if f.get("name") != FINISH]
    if workers and "\nFunction: " not in prompt:
        name = str(workers[0].get("name"))
        arguments = derive_arguments(workers[0], query)
        return f"Thought: I should call {name} to learn what the query asks.\nAction: {name}\nAction Input: {json.dumps(arguments)}"
    results = [line[len("Function: "):] for line in prompt.split("\n") if line.startswith("Function: ")]
    final = {"return_type": "give_answer", "final_answer": f"Answer to: {query[:200]} -- from the tools: {(results or ['none'])[-1][:200]}"}
    return f"Thought: I can answer now.\nAction: {FINISH}\nAction Input: {json.dumps(final)}"


class ToolLlamaStub(ChatStub):
    """ToolLLaMA v2 served by vLLM: ``POST /v1/completions`` answered by :func:`toolllama_text` (a string prompt, or
    each string of a list); ``POST /v1/chat/completions`` is not its route here."""

    default_model = "ToolBench/ToolLLaMA-2-7b-v2"

    def text(self, body: dict[str, Any], headers: dict[str, str]) -> str | None:
        prompt = body.get("prompt")
        prompt = prompt if isinstance(prompt, str) else "\n".join(p for p in prompt or [] if isinstance(p, str))
        return toolllama_text(prompt) + self._echo(headers)

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> Answer:
        return Answer(content="ToolLLaMA answers POST /v1/completions", finish_reason="stop")


# -- the judge ---------------------------------------------------------------------------------------


def judge_arguments(name: str, label: str) -> dict[str, Any]:
    """The arguments upstream's evaluators parse from a call of ``name``, with ``label`` (``Solved``/``Unsolved``)."""
    solved = label == "Solved"
    if name in ("check_answer_status", "parse_answer_status"):
        return {"answer_status": label, "reason": f"stub judge: {label}"}
    if name == "check_task_solvable":
        return {"task_status": "Solvable", "reason": "stub judge: the tools can answer it"}
    if name == "select_better_answer":
        return {"index": 0, "reason": "stub judge: the first"}
    if name == "check_solve_query":
        return {"is_solved": solved, "reason": f"stub judge: {label}"}
    if name == "select_best_final_answer":
        return {"best_answer_index": 0}
    if name == "parse_answer_details":
        return {"succeed_tool_calling": 1, "used_tool_types": 1}
    if name == "choose_preference":
        return {"preference": 0}
    return {"answer_status": label, "reason": f"stub judge: {label} ({name})"}


class JudgeStub(ChatStub):
    """The judge model: a label per request, deterministic at temperature 0, a seeded draw above it."""

    default_model = "gpt-3.5-turbo-16k"

    def __init__(
        self,
        *,
        seed: int = 0,
        random_above_zero: bool = True,
        label_at_zero: Callable[[dict[str, Any]], str] | None = None,
        port: int | None = None,
        echo_key: bool = False,
        model: str | None = None,
    ) -> None:
        """``label_at_zero(body)``: the deterministic label (default: from a digest of the messages)."""
        super().__init__(port=port, echo_key=echo_key, model=model)
        self.random_above_zero = random_above_zero
        self.label_at_zero = label_at_zero
        self._rng = random.Random(seed)
        self.labels: list[str] = []
        """The label of each completion answered, in order."""

    def label(self, body: dict[str, Any]) -> str:
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        if temperature > 0 and self.random_above_zero:
            with self._lock:
                return LABELS[self._rng.random() < 0.5]
        if self.label_at_zero is not None:
            return self.label_at_zero(body)
        return LABELS[int(_digest(body.get("messages"), 8), 16) % 2]

    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> Answer:
        label = self.label(body)
        with self._lock:
            self.labels.append(label)
        functions = offered_functions(body)
        name = forced_function(body) or (str(functions[0].get("name")) if functions else "check_answer_status")
        arguments = json.dumps(judge_arguments(name, label))
        content = f"The answer is {label}." + self._echo(headers)
        if not body.get("tools") and body.get("functions"):
            return Answer(content=content, function_call={"name": name, "arguments": arguments}, finish_reason="function_call")
        call_id = "call_" + _digest([body.get("messages"), name, label])
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        # a forced tool_choice ends with "stop", as OpenAI's API answers it
        return Answer(content=content, tool_calls=[call], finish_reason="stop" if forced_function(body) else "tool_calls")


# -- the wire ----------------------------------------------------------------------------------------


def _error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": str(code)}}



async def _send_stream(send: Any, completion_id: str, model: str, answer: Answer, usage: dict[str, int] | None) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, *, choices: bool = True, with_usage: Any = None) -> bytes:
        data: dict[str, Any] = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model, "system_fingerprint": "fp_stub",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}] if choices else [],
        }
        if with_usage is not None:
            data["usage"] = with_usage
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    text = answer.content or ""
    for start in range(0, len(text), 16):
        parts.append(chunk({"content": text[start:start + 16]}))
    for index, call in enumerate(answer.tool_calls):
        arguments = call["function"]["arguments"]
        first = {"index": index, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
        parts.append(chunk({"tool_calls": [first]}))
        for start in range(0, len(arguments), 16):
            parts.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[start:start + 16]}}]}))
    if answer.function_call is not None:
        parts.append(chunk({"function_call": answer.function_call}))
    parts.append(chunk({}, answer.finish_reason))
    if usage is not None:
        parts.append(chunk({}, choices=False, with_usage=usage))
    parts.append(b"data: [DONE]\n\n")
    for part in parts:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
