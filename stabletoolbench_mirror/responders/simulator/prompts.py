"""The chat messages sent to the simulator model, per prompt style.

``mirrorapi-sft`` / ``mirrorapi-cot`` / ``mirrorapi-cache``
    MirrorAPI's layout: a system prompt, then one user turn
    ``API doc:\\n{api_doc}\\n\\nRequest:\\n{request}`` where ``api_doc`` is Python's ``str()``
    of a dict with the keys ``api_name, api_description, required_parameters,
    optional_parameters, tool_description, tool_name, tool_category`` (in that order) and
    ``request`` is ``str()`` of the parsed input without any ``toolbench_key``.
    ``mirrorapi-cache`` (the MirrorAPI-Cache model) differs only in ``api_name``: the
    standardized API name, as upstream's ``main_mirrorapi_cache.py`` sends it, instead of
    the doc's display name.
``gpt-fewshot``
    StableToolBench's GPT-simulator style for any chat model: the API doc, up to
    ``max_examples`` cached answers of the same API (the ones whose input is most like the
    current one, within a character budget), then the input; the model answers a JSON object.
    Inside a session the user turn starts with the task and the session's last calls (:mod:`.history`).
``world-model``
    This project's prompt for stateful simulation inside a session (:mod:`.history`).

The default system prompts are this project's own text; ``system_prompt_file`` replaces
them with a user's file (see :mod:`.prompt_files`: a text file sent verbatim, or
StableToolBench's ``system_prompts.py`` read as a syntax tree).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rapidfuzz import fuzz

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.keys import plain_key
from stabletoolbench_mirror.core.naming import standardize
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.upstream.tooldocs import ApiDoc

MIRRORAPI_STYLES = ("mirrorapi-sft", "mirrorapi-cot", "mirrorapi-cache")
STYLES = (*MIRRORAPI_STYLES, "gpt-fewshot", "world-model")
MIRRORAPI_USER_TEMPLATE = "API doc:\n{api_doc}\n\nRequest:\n{request}"

SFT_SYSTEM_PROMPT = """\
You act as the server behind one API of a tool. You are given the API's documentation \
(its name, what it does, its required and optional parameters, and the tool it belongs to) \
and the parameters of one request. Work out what the real API would return for exactly \
these parameters and answer as that API.

Answer with one JSON object and nothing else, in this form:
{
    "error": "",
    "response": ""
}

- "error" stays empty when the request can be served. If the parameters are clearly \
unusable, put a short error message there, as the API would.
- "response" holds the API's output as text: usually the JSON body the API would send, \
with concrete, realistic and internally consistent values that follow from the request.
- Give real content, not placeholders or descriptions of what the content would be.
- Do not write anything before or after the JSON object."""

COT_SYSTEM_PROMPT = """\
[CHAIN_OF_THOUGHT]
You act as the server behind one API of a tool. You are given the API's documentation \
(its name, what it does, its required and optional parameters, and the tool it belongs to) \
and the parameters of one request. First reason briefly about how the API works and what \
it must do with these parameters, then answer as that API.

Answer with one JSON object and nothing else, in this form:
{
    "mechanism_of_the_api": "",
    "error": "",
    "response": ""
}

- "mechanism_of_the_api": a few sentences on how the API produces its output from the inputs.
- "error" stays empty when the request can be served. If the parameters are clearly \
unusable, put a short error message there, as the API would.
- "response" holds the API's output as text: usually the JSON body the API would send, \
with concrete, realistic and internally consistent values that follow from the request.
- Do not write anything before or after the JSON object."""

GPT_SYSTEM_PROMPT = """\
You simulate one API of a tool for an agent that is being evaluated. You get the API's \
documentation, a few earlier calls of the same API with the answers they got, and the \
input of a new call. Answer the new call as the real API would.

Reply with one JSON object, exactly:
{"error": "", "response": "<the API's output>"}

- "error" stays empty unless the input cannot be served; then give a short error message.
- "response" is the API's output as text, usually a JSON body, with concrete and realistic \
values that follow from the input. Keep it reasonably short (roughly 100 to 200 words).
- Follow the format and the level of detail of the earlier answers when they are useful; \
when they are empty or errors, ignore them and answer on your own.
- Nothing outside the JSON object."""

# world-model: this project's prompt for stateful simulation (see .history for its user turn)
WORLD_MODEL_SYSTEM_PROMPT = """\
You are the environment behind the tools an agent uses to solve a task. Each message gives \
the task, the documentation of one API, the calls the agent already made in this session \
with the answers they got (oldest first), and one new call. Answer the new call exactly as \
the real API would, given everything that happened before it.

Keep the world consistent across the session:
- What an earlier call created (a record, an order, a meeting, an account, an id, a token) \
exists now, with the values it was created with.
- What an earlier call changed shows its new values; what an earlier call deleted is gone, \
and reading it gets the API's not-found answer.
- Ids, names, numbers, dates and totals already shown stay the same; new ids do not clash \
with earlier ones.
- A call that needs something never created, or a token never issued, gets the error the \
API would give.
- Only the listed calls happened; do not assume others.

Reply with one JSON object, exactly:
{"error": "", "response": "<the API's output>"}

- "error" stays empty unless the call cannot be served; then give a short error message.
- "response" is the API's output as text, usually a JSON body, with concrete values.
- Nothing outside the JSON object."""

DEFAULT_SYSTEM_PROMPTS = {
    "mirrorapi-sft": SFT_SYSTEM_PROMPT,
    "mirrorapi-cot": COT_SYSTEM_PROMPT,
    "mirrorapi-cache": SFT_SYSTEM_PROMPT,
    "gpt-fewshot": GPT_SYSTEM_PROMPT,
    "world-model": WORLD_MODEL_SYSTEM_PROMPT,
}


def api_doc_dict(call: ToolCall, doc: ApiDoc | None, style: str = "mirrorapi-sft") -> dict[str, Any]:
    """The ``api_doc`` dict of MirrorAPI's prompt, keys in its training order.

    Without a doc the simulator still gets the API, tool and category names.
    ``mirrorapi-cache`` names the API by its standardized name (upstream's cache server).
    """
    if style == "mirrorapi-cache":
        api_name = standardize(call.names.api_name)
    else:
        api_name = doc.name if doc is not None else call.api_name
    return {
        "api_name": api_name,
        "api_description": doc.description if doc is not None else "",
        "required_parameters": doc.required_parameters if doc is not None else [],
        "optional_parameters": doc.optional_parameters if doc is not None else [],
        "tool_description": doc.tool_description if doc is not None else "",
        "tool_name": _tool_name(call),
        "tool_category": call.names.category,
    }


def _tool_name(call: ToolCall) -> str:
    # upstream passes the client's tool name, cut at any ``_for_<category>`` suffix
    return call.tool_name.split("_for_")[0] if "_for_" in call.tool_name else call.tool_name


def request_value(call: ToolCall) -> Any:
    """The parsed input as the simulator sees it: without any ``toolbench_key``."""
    value = call.tool_input
    if isinstance(value, dict) and "toolbench_key" in value:
        value = {k: v for k, v in value.items() if k != "toolbench_key"}
    return value


def mirrorapi_user_turn(call: ToolCall, doc: ApiDoc | None, style: str = "mirrorapi-sft") -> str:
    return MIRRORAPI_USER_TEMPLATE.format(api_doc=str(api_doc_dict(call, doc, style)), request=str(request_value(call)))


def mirrorapi_messages(system_prompt: str, call: ToolCall, doc: ApiDoc | None, style: str = "mirrorapi-sft") -> list[dict[str, str]]:
    """The messages of a MirrorAPI style: the live prompt, and the training export's first two turns."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": mirrorapi_user_turn(call, doc, style)},
    ]


# -- gpt-fewshot ------------------------------------------------------------------------------

EXAMPLES_BUDGET_CHARS = 2048  # a gpt-fewshot prompt's cached examples, in characters (input keys and answers' JSON)


def choose_examples(call: ToolCall, records: Sequence[Record], max_examples: int, budget_chars: int) -> list[tuple[str, Any]]:
    """Up to ``max_examples`` ``(input key, answer)`` pairs, most similar input first, within the budget.

    Similarity is rapidfuzz's ratio between the upstream keys (``str()`` of the inputs).  An
    example's size is its input key plus its answer's JSON text; one that would push the
    examples past ``budget_chars`` is skipped.
    """
    if max_examples <= 0 or budget_chars <= 0 or not records:
        return []
    seen: set[str] = set()
    candidates: list[tuple[float, int, str, Record]] = []
    # keys recorded inside a session carry a history hash (see keys.session_key): compare and show the input only
    own = plain_key(call.key)
    for position, record in enumerate(records):
        key = plain_key(record.key)
        if key == own or key in seen:
            continue
        seen.add(key)
        candidates.append((fuzz.ratio(own, key), position, key, record))
    candidates.sort(key=lambda c: (-c[0], c[1]))
    chosen: list[tuple[str, Any]] = []
    used = 0
    for _score, _position, key, record in candidates:
        try:
            answer = record.answer
        except ValueError:
            continue
        size = example_chars(key, answer)
        if used + size > budget_chars:
            continue
        chosen.append((key, answer))
        used += size
        if len(chosen) >= max_examples:
            break
    return chosen


def example_chars(key: str, answer: Any) -> int:
    """The characters an example takes in the budget: its input key and its answer as JSON."""
    return len(key) + len(json.dumps(answer, ensure_ascii=False))


def gpt_fewshot_user_turn(call: ToolCall, doc: ApiDoc | None, examples: Sequence[tuple[str, Any]]) -> str:
    doc_dict = api_doc_dict(call, doc)
    parts = ["API documentation:", json.dumps(doc_dict, ensure_ascii=False), ""]
    if examples:
        parts.append("Earlier calls of this API:")
        for number, (key, answer) in enumerate(examples, 1):
            parts.append(f"{number}. input: {key}")
            parts.append(f"   answer: {json.dumps(answer, ensure_ascii=False)}")
    else:
        parts.append("Earlier calls of this API: none")
    parts += ["", "Input of the new call:", str(request_value(call))]
    return "\n".join(parts)


def gpt_fewshot_messages(
    system_prompt: str,
    call: ToolCall,
    doc: ApiDoc | None,
    records: Sequence[Record],
    *,
    max_examples: int = 5,
) -> list[dict[str, str]]:
    examples = choose_examples(call, records, max_examples, EXAMPLES_BUDGET_CHARS)
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": gpt_fewshot_user_turn(call, doc, examples)},
    ]


# -- structured output ------------------------------------------------------------------------


def response_schema(cot: bool, max_chars: int | None = None) -> dict[str, Any]:
    """The JSON schema of a simulator answer: ``error`` and ``response`` (``mechanism_of_the_api`` first for CoT).

    ``max_chars`` bounds each string (a small random model otherwise runs to ``max_tokens``
    inside a string and never closes the object).
    """
    string: dict[str, Any] = {"type": "string"}
    if max_chars is not None:
        string["maxLength"] = int(max_chars)
    keys = (["mechanism_of_the_api"] if cot else []) + ["error", "response"]
    return {
        "type": "object",
        "properties": {k: dict(string) for k in keys},
        "required": keys,
        "additionalProperties": False,
    }


def structured_output_fields(cot: bool, max_chars: int | None = None) -> dict[str, Any]:
    """vLLM's (OpenAI-style) request field asking for schema-constrained JSON."""
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "simulated_api_answer", "schema": response_schema(cot, max_chars), "strict": True},
        }
    }
