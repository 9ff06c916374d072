"""Small StableToolBench answer files, laid out as the inference pipeline writes them.

``dfs_answer`` builds a DFS file (``tree.tree`` of ``Action`` / ``Action Input`` nodes plus
``answer_generation.train_messages``), ``cot_answer`` a CoT file (``trys[].chain``).
Each call is ``(function_name, arguments_text, observation_text)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

Call = tuple[str, str, str]

SYSTEM = "You are AutoGPT, you can use many tools(functions) to do the following task."


def _node(node_type: str, description: str, depth: int, **extra: Any) -> dict[str, Any]:
    node = {
        "is_terminal": False,
        "pruned": False,
        "finished": False,
        "depth": depth,
        "node_type": node_type,
        "description": description,
        "Elo": 1000.0,
        "child_count": 0,
        "expand_num": 0,
    }
    node.update(extra)
    return node


def _functions(names: Sequence[str]) -> list[dict[str, Any]]:
    out = [
        {
            "name": name,
            "description": f'This is the subfunction for tool "{name.split("_for_")[-1]}", you can use this tool.',
            "parameters": {"type": "object", "properties": {}, "required": [], "optional": []},
        }
        for name in dict.fromkeys(names)
    ]
    out.append({"name": "Finish", "description": "finish", "parameters": {"type": "object", "properties": {}, "required": ["return_type"]}})
    return out


def _messages(query: str, calls: Sequence[Call], final_answer: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"\n{query}\nBegin!\n"}]
    for name, arguments, observation in calls:
        messages.append({"role": "assistant", "content": "Thought.", "function_call": {"name": name, "arguments": arguments}})
        messages.append({"role": "function", "name": name, "content": observation})
    messages.append(
        {
            "role": "assistant",
            "function_call": {"name": "Finish", "arguments": json.dumps({"return_type": "give_answer", "final_answer": final_answer})},
        }
    )
    return messages


def dfs_answer(query: str, calls: Sequence[Call], *, extra_branch: Sequence[Call] = (), final_answer: str = "done") -> dict[str, Any]:
    """A DFS answer file: ``calls`` as one path of the tree, ``extra_branch`` as a sibling branch of the first call."""
    root = _node("Action Input", "", 0, io_state={}, children=[])

    def chain(parent: dict[str, Any], items: Sequence[Call], depth: int) -> None:
        for name, arguments, observation in items:
            action = _node("Action", name, depth, children=[])
            action_input = _node("Action Input", arguments, depth + 1, observation=observation, observation_code=0, io_state={}, children=[])
            action["children"].append(action_input)
            parent["children"].append(action)
            parent = action_input
            depth += 2
        finish = _node("Action", "Finish", depth, children=[])
        finish["children"].append(_node("Action Input", json.dumps({"return_type": "give_answer", "final_answer": final_answer}), depth + 1, observation='{"response":"successfully giving the final answer."}', observation_code=3, children=[]))
        parent["children"].append(finish)

    chain(root, calls, 1)
    if extra_branch:
        thought = _node("Thought", "Let me try something else.", 1, children=[])
        root["children"].append(thought)
        chain(thought, extra_branch, 2)
    names = [c[0] for c in list(calls) + list(extra_branch)]
    return {
        "win": True,
        "tree": {"size": 10, "max_length": 10, "tree": root},
        "forward_args": {"single_chain_max_step": 12, "tree_beam_size": 2, "max_query_count": 200, "answer": 1, "with_filter": False},
        "compare_candidates": [],
        "answer_generation": {
            "valid_data": True,
            "query_count": len(names),
            "total_tokens": 1234,
            "final_answer": json.dumps({"return_type": "give_answer", "final_answer": final_answer}),
            "finish_type": "give_answer",
            "function": _functions(names),
            "chain": [],
            "train_messages": [_messages(query, calls, final_answer)],
            "query": query,
        },
    }


def cot_answer(query: str, calls: Sequence[Call]) -> dict[str, Any]:
    """A CoT answer file whose single try is ``calls`` (no train messages, as for an unfinished try)."""
    chain = []
    for depth, (name, arguments, observation) in enumerate(calls):
        chain.append(_node("Action", name, 2 * depth + 1))
        chain.append(_node("Action Input", arguments, 2 * depth + 2, observation=observation, observation_code=0, io_state={}))
    return {
        "win": False,
        "try_count": 1,
        "trys": [{"chain": chain, "win": False}],
        "compare_candidates": [],
        "forward_args": {"single_chain_max_step": 12, "pass_at": 1, "answer": 1},
        "answer_generation": {
            "valid_data": False,
            "final_answer": "",
            "function": _functions([c[0] for c in calls]),
            "query_count": len(calls),
            "total_tokens": 999,
            "train_messages": [],
            "chain": [],
            "query": query,
        },
    }


def query(query_id: int, apis: Sequence[dict[str, Any]], text: str = "a test query") -> dict[str, Any]:
    return {"query": text, "query_id": query_id, "api_list": list(apis), "relevant APIs": []}


def api(category: str, tool: str, name: str, required: Sequence[dict] = (), optional: Sequence[dict] = ()) -> dict[str, Any]:
    return {
        "category_name": category,
        "tool_name": tool,
        "api_name": name,
        "api_description": "",
        "required_parameters": list(required),
        "optional_parameters": list(optional),
        "method": "GET",
    }


def param(name: str, type_: str, default: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "description": "", "default": default}
