"""``demo-models``: a scripted agent, judge and simulator behind one OpenAI-compatible server, to try ``score`` with no key.

Three models, told apart by the request's ``model`` (:data:`AGENT`, :data:`JUDGE`, :data:`SIMULATOR`), each answering
``POST /v1/chat/completions`` as the StableToolBench code that calls it reads the answer (``GET /v1/models`` lists
them; any other model is HTTP 404):

* the **agent** speaks the function-calling format of ``qa_pipeline --backbone_model chatgpt_function`` (its name
  starts with ``gpt``, as that backbone requires): offered ``tools`` (or the older ``functions``), it calls the first
  one that is not ``Finish``, with arguments made from that function's required parameters, until a tool's result
  is in the conversation; then ``Finish`` with ``give_answer`` and a final answer quoting that result;
* the **judge** answers the function an evaluator of ``eval_pass_rate``/``eval_preference`` forces (``tool_choice``,
  or ``function_call``) with the arguments that evaluator parses; its label (``Solved`` or ``Unsolved``) is drawn
  from the request's SHA-256, so the same request always gets the same label;
* the **simulator** answers a tool call's miss as MirrorAPI's prompt asks, ``{"error": "", "response": ...}``.

Every answer is a function of the request alone (its ``id`` included), so a run recorded with these models is
the same run each time.  They play the parts, nothing more: the score they give measures nothing.  Written here
by hand because no library plays an OpenAI-compatible model offline; FastAPI serves it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

AGENT = "gpt-demo-agent"
JUDGE = "gpt-demo-judge"
SIMULATOR = "demo-simulator"
MODELS = (AGENT, JUDGE, SIMULATOR)
FINISH = "Finish"
LABELS = ("Solved", "Unsolved")
MAX_QUOTED_CHARS = 300  # how much of the query and of the last tool result the agent's final answer quotes


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")).hexdigest()


def offered_functions(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The functions a request offers: ``tools[].function``, else the older ``functions``."""
    tools = [t["function"] for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    return tools or [f for f in body.get("functions") or [] if isinstance(f, dict)]


def forced_function(body: dict[str, Any]) -> str | None:
    """The function ``tool_choice`` (or ``function_call``) names, if it names one."""
    choice = body.get("tool_choice", body.get("function_call"))
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if "function" in choice else choice.get("name")
        return str(name) if name else None
    return None


def user_query(messages: list[dict[str, Any]]) -> str:
    """The user's turn (upstream writes ``"\\n{query}\\nBegin!\\n"``)."""
    text = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "").strip()
    return text.removesuffix("Begin!").strip()


def arguments_for(function: dict[str, Any], query: str) -> dict[str, Any]:
    """Each required parameter of ``function``: its ``example_value``, else 1, ``true`` or a few words of the query."""
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    arguments: dict[str, Any] = {}
    for name in (n for n in parameters.get("required") or [] if n in properties):
        spec = properties[name] if isinstance(properties[name], dict) else {}
        kind, example = spec.get("type", "string"), spec.get("example_value")
        if example not in (None, ""):
            arguments[name] = example
        elif kind in ("integer", "number"):
            arguments[name] = 1
        elif kind == "boolean":
            arguments[name] = True
        else:
            arguments[name] = " ".join(query.split()[:4]) or name
    return arguments


def _call(body: dict[str, Any], name: str, arguments: dict[str, Any], content: str | None) -> tuple[dict[str, Any], str]:
    """The assistant message calling ``name`` in the request's own format, and its ``finish_reason``."""
    text = json.dumps(arguments, ensure_ascii=False)
    if not body.get("tools") and body.get("functions"):
        return {"role": "assistant", "content": content, "function_call": {"name": name, "arguments": text}}, "function_call"
    call = {"id": "call_" + digest([body.get("messages"), name, text])[:24], "type": "function",
            "function": {"name": name, "arguments": text}}
    return {"role": "assistant", "content": content, "tool_calls": [call]}, "tool_calls"


def agent_message(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The agent's next message (see the module's docstring) and its ``finish_reason``."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    functions = offered_functions(body)
    query = user_query(messages)
    results = [m for m in messages if m.get("role") in ("tool", "function")]
    names = [f.get("name") for f in functions]
    workers = [f for f in functions if f.get("name") != FINISH]
    if workers and not results:
        return _call(body, str(workers[0].get("name")), arguments_for(workers[0], query),
                     f"I will call {workers[0].get('name')} to answer the query.")
    if FINISH in names:
        seen = str(results[-1].get("content") or "")[:MAX_QUOTED_CHARS] if results else "no tool result"
        final = f"Answer to: {query[:MAX_QUOTED_CHARS]} -- from the tools: {seen}"
        return _call(body, FINISH, {"return_type": "give_answer", "final_answer": final}, None)
    return {"role": "assistant", "content": f"Answer to: {query[:MAX_QUOTED_CHARS]}"}, "stop"


def judge_arguments(name: str, label: str) -> dict[str, Any]:
    """What upstream's evaluators parse from a call of ``name``, with ``label``."""
    fixed: dict[str, dict[str, Any]] = {
        "check_task_solvable": {"task_status": "Solvable", "reason": "demo judge: the tools can answer it"},
        "select_better_answer": {"index": 0, "reason": "demo judge: the first"},
        "check_solve_query": {"is_solved": label == "Solved", "reason": f"demo judge: {label}"},
        "select_best_final_answer": {"best_answer_index": 0},
        "parse_answer_details": {"succeed_tool_calling": 1, "used_tool_types": 1},
        "choose_preference": {"preference": 0},
    }
    return fixed.get(name, {"answer_status": label, "reason": f"demo judge: {label}"})


def judge_message(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The judge's call of the forced (else the first offered) function; ``stop`` when forced, as OpenAI answers it."""
    label = LABELS[int(digest(body.get("messages"))[:8], 16) % 2]
    functions = offered_functions(body)
    forced = forced_function(body)
    name = forced or (str(functions[0].get("name")) if functions else "check_answer_status")
    message, finish = _call(body, name, judge_arguments(name, label), f"The answer is {label}.")
    return message, "stop" if forced and finish == "tool_calls" else finish


def simulator_message(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    answer = {"error": "", "response": f"demo simulator answer {digest(body.get('messages'))[:12]}"}
    return {"role": "assistant", "content": json.dumps(answer)}, "stop"


ANSWERS = {AGENT: agent_message, JUDGE: judge_message, SIMULATOR: simulator_message}


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion of a request to one of :data:`MODELS`."""
    message, finish = ANSWERS[body["model"]](body)
    prompt = max(1, len(json.dumps(body.get("messages"), ensure_ascii=False)) // 4)
    answered = max(1, len(json.dumps(message, ensure_ascii=False)) // 4)
    return {"id": "chatcmpl-demo-" + digest(body)[:24], "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": answered, "total_tokens": prompt + answered}}


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}, status)


def create_app() -> FastAPI:
    """The demo models' server (``uvicorn`` runs it: ``stabletoolbench-mirror demo-models``)."""
    app = FastAPI(title="stabletoolbench-mirror demo models", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "demo"} for m in MODELS]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "a chat request is a JSON object with a messages list")
        if body.get("stream"):
            return _error(400, "the demo models answer whole completions only (stream: false)")
        if body.get("model") not in ANSWERS:
            return _error(404, f"model {str(body.get('model'))[:200]!r}: the demo models are {', '.join(MODELS)}", "model_not_found")
        return JSONResponse(completion(body))

    return app
