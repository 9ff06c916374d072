"""Prompts that carry a session: its task and its last calls and answers.

``gpt-fewshot``
    Inside a session, the usual few-shot user turn is preceded by the session block (task,
    then the last ``simulator.history`` calls with their answers, oldest first; each input and
    answer cut at 1,024 characters).  Outside a session the prompt is exactly as before.
``world-model``
    This project's prompt for stateful simulation: the model answers as the environment
    behind all the tools of a task, keeping what earlier calls created, changed or deleted.
    No few-shot examples (answers made in other states would mislead it).

MirrorAPI styles never get a history: the model was not trained with one.
"""

from __future__ import annotations

import json
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.responders.simulator.prompts import api_doc_dict, request_value
from stabletoolbench_mirror.upstream.tooldocs import ApiDoc

#: an earlier answer longer than this is cut in the prompt (StableToolBench's agents see 1,024 characters too)
MAX_ANSWER_CHARS = 1024
#: an earlier call's input (as JSON) longer than this is cut in the prompt, as its answer is
MAX_INPUT_CHARS = 1024
MAX_TASK_CHARS = 4000


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _answer_text(answer: Any) -> str:
    return _cut(json.dumps(answer, ensure_ascii=False), MAX_ANSWER_CHARS)


def _input_text(tool_input: Any) -> str:
    return _cut(json.dumps(tool_input, ensure_ascii=False), MAX_INPUT_CHARS)


def session_block(call: ToolCall) -> str:
    """The task and the earlier calls of ``call``'s session, as prompt text ("" outside a session)."""
    context = call.session
    if context is None:
        return ""
    task = _cut(context.task, MAX_TASK_CHARS) if context.task else "(not given)"
    lines = ["Task of this session:", task, ""]
    if context.history:
        lines.append("Earlier calls in this session (oldest first):")
        for number, item in enumerate(context.history, 1):
            lines.append(f"{number}. {item.api} input: {_input_text(item.tool_input)}")
            lines.append(f"   answer: {_answer_text(item.answer)}")
    else:
        lines.append("Earlier calls in this session: none")
    return "\n".join(lines)


def with_session(call: ToolCall, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """``messages`` with the session block put before the last user turn (unchanged outside a session)."""
    block = session_block(call)
    if not block:
        return messages
    out = [dict(m) for m in messages]
    out[-1]["content"] = block + "\n\n" + out[-1]["content"]
    return out


def world_model_messages(system_prompt: str, call: ToolCall, doc: ApiDoc | None) -> list[dict[str, str]]:
    parts = []
    block = session_block(call)
    if block:
        parts += [block, ""]
    parts += [
        "API documentation:",
        json.dumps(api_doc_dict(call, doc), ensure_ascii=False),
        "",
        f"New call: {call.api}",
        f"input: {json.dumps(request_value(call), ensure_ascii=False)}",
    ]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": "\n".join(parts)}]
