"""Local tools of the example environment (written for stabletoolbench-mirror, in the style of API-Bank).

Four APIs over a small world kept in the session's ``state``:

* ``Example Auth / Login``: checks a user and issues a token;
* ``Example Meetings / Add Meeting``, ``Query Meeting``, ``Delete Meeting``: a meeting calendar;
  every call needs a token that ``Login`` issued in the same session;
* ``Example Calculator / Calculate``: arithmetic on an expression (parsed, never evaluated).

Each function gets the call's input and the session's state, and returns its answer: a dict
with ``error`` and ``response`` is served as it is, any other value as ``response`` (JSON text).
"""

from __future__ import annotations

import ast
import hashlib
import operator
from datetime import date

USERS = {"ana": "secret", "ben": "hunter2"}


def _unauthorized(why: str) -> dict:
    return {"error": "Unauthorized error...", "response": why}


def login(tool_input: dict, state: dict) -> dict:
    username, password = tool_input.get("username"), tool_input.get("password")
    if not isinstance(username, str) or USERS.get(username) != password:
        return _unauthorized("wrong username or password")
    token = "tok-" + hashlib.sha256(username.encode()).hexdigest()[:10]
    state.setdefault("tokens", {})[token] = username
    return {"token": token, "user": username}


def _user(tool_input: dict, state: dict) -> str | None:
    return state.get("tokens", {}).get(tool_input.get("token"))


def add_meeting(tool_input: dict, state: dict) -> dict:
    user = _user(tool_input, state)
    if user is None:
        return _unauthorized("log in first: the token is missing or was not issued in this session")
    name, day = tool_input.get("name"), tool_input.get("date")
    if not isinstance(name, str) or not name.strip():
        return {"error": "", "response": "name: give the meeting a name"}
    try:
        date.fromisoformat(str(day))
    except ValueError:
        return {"error": "", "response": "date: expected YYYY-MM-DD"}
    attendees = tool_input.get("attendees") or []
    state["next_id"] = state.get("next_id", 0) + 1
    meeting = {"id": state["next_id"], "name": name, "date": day, "attendees": attendees, "owner": user}
    state.setdefault("meetings", []).append(meeting)
    return {"added": meeting}


def query_meeting(tool_input: dict, state: dict) -> dict:
    if _user(tool_input, state) is None:
        return _unauthorized("log in first: the token is missing or was not issued in this session")
    found = [
        m
        for m in state.get("meetings", [])
        if tool_input.get("name") in (None, "", m["name"]) and tool_input.get("date") in (None, "", m["date"])
    ]
    return {"meetings": found}


def delete_meeting(tool_input: dict, state: dict) -> dict:
    if _user(tool_input, state) is None:
        return _unauthorized("log in first: the token is missing or was not issued in this session")
    # StableToolBench shows the doc's parameter ``id`` to the agent as ``is_id``
    meeting_id = tool_input.get("is_id", tool_input.get("id"))
    meetings = state.get("meetings", [])
    kept = [m for m in meetings if m["id"] != meeting_id]
    if len(kept) == len(meetings):
        return {"error": "", "response": f"no meeting with id {meeting_id!r}"}
    state["meetings"] = kept
    return {"deleted": meeting_id}


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError("only numbers, + - * / % ** and parentheses")


def calculate(tool_input: dict, state: dict) -> dict:
    expression = tool_input.get("expression")
    if not isinstance(expression, str) or len(expression) > 200:
        return {"error": "", "response": "expression: a formula of at most 200 characters"}
    try:
        result = _value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return {"error": "", "response": f"cannot calculate {expression!r}: {exc}"}
    return {"expression": expression, "result": result}


TOOLS = {
    "Tools/Example Auth/Login": login,
    "Tools/Example Meetings/Add Meeting": add_meeting,
    "Tools/Example Meetings/Query Meeting": query_meeting,
    "Tools/Example Meetings/Delete Meeting": delete_meeting,
    "Tools/Example Calculator/Calculate": calculate,
}
