"""The tool calls recorded in StableToolBench / ToolBench answer files.

An answer file (``<answer_dir>/<query_id>_<method>.json``, written by the inference
pipeline) holds the agent's calls in up to three places, all read here:

* ``tree.tree``: the DFS search tree; a node with ``node_type: "Action"`` names the function
  (``description``) and its ``"Action Input"`` children hold the arguments text
  (``description``) and the ``observation`` the agent saw;
* ``trys[].chain``: CoT chains, a flat list of the same nodes (``Action`` then ``Action Input``);
* ``answer_generation.train_messages``: lists of chat messages; an assistant message's
  ``function_call`` (``name``, ``arguments``) or ``tool_calls[].function`` is answered by the
  next ``function`` message (or the ``tool`` message with its ``tool_call_id``).

Calls of ``Finish`` are the agent's final answer, not tool calls, and are left out.
The observation is the text the agent saw: ``json.dumps(answer)`` cut to
``max_observation_length`` characters plus ``"..."``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.upstream.queries import ApiRef, FunctionIndex, iter_json_files, read_json_file

FINISH = "Finish"
DEFAULT_MAX_OBSERVATION_LENGTH = 1024


@dataclass(frozen=True)
class AnswerCall:
    """One call found in an answer file."""

    function: str
    arguments: str
    """The arguments text exactly as the agent produced it (sent as ``tool_input``)."""
    observation: str | None
    """What the agent saw, when the file records it."""
    query_id: str | None
    location: str
    """``file:path.in.file``: where the call is recorded."""


def observation_text(answer: Any, max_length: int = DEFAULT_MAX_OBSERVATION_LENGTH) -> str:
    """The observation the client shows the agent for a 200 JSON answer."""
    text = json.dumps(answer)
    return text[:max_length] + "..." if len(text) > max_length else text


def query_id_of(path: str | os.PathLike[str]) -> str:
    """The query id in an answer file name (``588_DFS_woFilter_w2.json`` -> ``588``), as upstream's converter reads it."""
    return Path(path).name.split("_")[0].removesuffix(".json")


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return None


def _tree_calls(node: Any, where: str, out: list[tuple[str, str, str | None, str]]) -> None:
    stack = [(node, where)]
    while stack:
        current, path = stack.pop()
        if not isinstance(current, dict):
            continue
        children = current.get("children") or []
        if not isinstance(children, list):
            continue
        if current.get("node_type") == "Action" and isinstance(current.get("description"), str):
            for child in children:
                if isinstance(child, dict) and child.get("node_type") == "Action Input":
                    args = _text(child.get("description"))
                    if args is not None:
                        out.append((current["description"], args, _text(child.get("observation")), path))
        for i, child in reversed(list(enumerate(children))):
            stack.append((child, f"{path}/{i}"))


def _chain_calls(chain: Any, where: str, out: list[tuple[str, str, str | None, str]]) -> None:
    if not isinstance(chain, list):
        return
    for i, node in enumerate(chain):
        if not (isinstance(node, dict) and node.get("node_type") == "Action" and isinstance(node.get("description"), str)):
            continue
        nxt = chain[i + 1] if i + 1 < len(chain) else None
        if isinstance(nxt, dict) and nxt.get("node_type") == "Action Input":
            args = _text(nxt.get("description"))
            if args is not None:
                out.append((node["description"], args, _text(nxt.get("observation")), f"{where}[{i}]"))


def _message_calls(messages: Any, where: str, out: list[tuple[str, str, str | None, str]]) -> None:
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        call = message.get("function_call")
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            args = _text(call.get("arguments"))
            if args is not None:
                out.append((call["name"], args, _function_observation(messages, i), f"{where}[{i}]"))
        for tool_call in message.get("tool_calls") or []:
            if not isinstance(tool_call, dict) or not isinstance(tool_call.get("function"), dict):
                continue
            fn = tool_call["function"]
            args = _text(fn.get("arguments"))
            if isinstance(fn.get("name"), str) and args is not None:
                out.append((fn["name"], args, _tool_observation(messages, i, tool_call.get("id")), f"{where}[{i}]"))


def _function_observation(messages: list[Any], i: int) -> str | None:
    """The observation of message ``i``'s ``function_call``: the ``function`` message right after it."""
    nxt = messages[i + 1] if i + 1 < len(messages) else None
    return _text(nxt.get("content")) if isinstance(nxt, dict) and nxt.get("role") == "function" else None


def _tool_observation(messages: list[Any], i: int, call_id: Any) -> str | None:
    """The observation of one of message ``i``'s ``tool_calls``: the first later ``tool`` message with its id."""
    for later in messages[i + 1 :]:
        if isinstance(later, dict) and later.get("role") == "tool" and later.get("tool_call_id") == call_id:
            return _text(later.get("content"))
    return None


def calls_in_answer(data: Any, *, query_id: str | None = None, location: str = "") -> list[AnswerCall]:
    """Every distinct tool call recorded in one decoded answer file (``Finish`` excluded), in file order."""
    if not isinstance(data, dict):
        raise ValueError("not an answer file (expected a JSON object)")
    found: list[tuple[str, str, str | None, str]] = []
    tree = data.get("tree")
    if isinstance(tree, dict):
        _tree_calls(tree.get("tree"), "tree", found)
    for t, attempt in enumerate(data.get("trys") or []):
        if isinstance(attempt, dict):
            _chain_calls(attempt.get("chain"), f"trys[{t}].chain", found)
    generation = data.get("answer_generation")
    if isinstance(generation, dict):
        for m, conversation in enumerate(generation.get("train_messages") or []):
            _message_calls(conversation, f"train_messages[{m}]", found)
    calls: list[AnswerCall] = []
    seen: set[tuple[str, str, str | None]] = set()
    for function, arguments, observation, where in found:
        if function == FINISH:
            continue
        ident = (function, arguments, observation)
        if ident in seen:
            continue
        seen.add(ident)
        calls.append(AnswerCall(function, arguments, observation, query_id, f"{location}:{where}" if location else where))
    return calls


def read_answer_file(path: str | os.PathLike[str]) -> list[AnswerCall]:
    """The calls of one answer file; ``ValueError`` when it is not one."""
    data = read_json_file(path)
    try:
        return calls_in_answer(data, query_id=query_id_of(path), location=str(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def answer_payload(ref: ApiRef, arguments: str) -> dict[str, Any]:
    """The ``/virtual`` body the client sends for an agent's call (no key: warming and checks carry none)."""
    return {
        "category": ref.category,
        "tool_name": ref.tool_name,
        "api_name": ref.api_name,
        "tool_input": arguments,
        "strip": "",
        "toolbench_key": "",
    }


@dataclass(frozen=True)
class FoundCall:
    """A call of an answer file with the ``/virtual`` body the client sends for it, or why there is none."""

    location: str
    payload: dict[str, Any] | None
    """``None`` when the function name does not resolve to an API, or the file cannot be read."""
    observation: str | None
    problem: str = ""
    file_error: bool = False
    """The whole file could not be read (``problem`` names it)."""


def iter_answer_calls(paths: Iterable[str | os.PathLike[str]], index: FunctionIndex) -> Iterator[FoundCall]:
    """Every call of the answer files under ``paths``, resolved through ``index``, file by file.

    Raises :class:`QueryFileError` (a ``ValueError``) for a path that does not exist; a file that is not an answer file
    gives one :class:`FoundCall` with ``file_error``.
    """
    for path in list(iter_json_files(paths)):
        try:
            calls = read_answer_file(path)
        except ValueError as exc:
            yield FoundCall(str(path), None, None, str(exc), file_error=True)
            continue
        for call in calls:
            ref, reason = index.resolve(call.function, call.query_id)
            if ref is None:
                yield FoundCall(call.location, None, call.observation, reason)
            else:
                yield FoundCall(call.location, answer_payload(ref, call.arguments), call.observation)


def function_index(query_paths: Sequence[str | os.PathLike[str]], tools_folder: str | os.PathLike[str] | None) -> FunctionIndex:
    """The index answer files are read with: the APIs of the query files and of a tools folder.

    ``ValueError`` (naming what to give) when there is neither, or one cannot be read.
    """
    index = FunctionIndex()
    index.add_query_files(query_paths)  # QueryFileError, a ValueError, naming what cannot be read
    if tools_folder:
        index.add_tools_folder(tools_folder)
    if not len(index):
        raise ValueError(
            "answer files need query files (--queries) or a tools folder (--tools-folder, or 'tools_folder') to map function names to APIs"
        )
    return index
