"""StableToolBench's ``/virtual`` wire protocol: the request model and the exact answer strings.

Answers are JSON objects ``{"error": ..., "response": ...}``.  The StableToolBench
client turns the ``error`` text into a status code by exact string comparison,
so the strings below must not change.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

# error texts the StableToolBench client maps to a status code (exact comparison)
API_NOT_WORKING = "API not working error..."  # -> status 6
UNAUTHORIZED = "Unauthorized error..."  # -> status 7
UNSUBSCRIBED = "Unsubscribed error..."  # -> status 8
TOO_MANY_REQUESTS = "Too many requests error..."  # -> status 9
RATE_LIMIT_PER_MINUTE = "Rate limit per minute error..."  # -> status 10
MESSAGE_ERROR = "Message error..."  # -> status 11

# upstream server answers
TOOL_INPUT_PARSE_ERROR = "Tool input parse error...\n"
SIMULATION_FAILED = "Failed to generate fake response"
CHAT_WITH_USER_API = "chat_with_user"

#: The answer to a cache miss that nothing may fill (``replay`` mode, or nothing configured).
#: Its ``error`` is the text the client maps to "API not working" (status 6), so an agent
#: sees a failed call rather than an invented answer.
MISS_ERROR = API_NOT_WORKING


def answer(error: str, response: Any) -> dict[str, Any]:
    """An answer object in upstream key order (``error`` first)."""
    return {"error": error, "response": response}


def chat_with_user_answer() -> dict[str, Any]:
    return answer("", "Chat with user.")


def parse_error_answer() -> dict[str, Any]:
    return answer(TOOL_INPUT_PARSE_ERROR, "")


def simulation_failed_answer() -> dict[str, Any]:
    return answer(SIMULATION_FAILED, "")


def miss_answer(api: str, reason: str) -> dict[str, Any]:
    return answer(MISS_ERROR, f"stabletoolbench-mirror: no recorded response for {api} ({reason}).")


def encode_answer(body: Any) -> str:
    """Serialise an answer exactly as FastAPI's default ``JSONResponse`` (and so upstream) does."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


#: The longest ``category``, ``tool_name`` or ``api_name`` accepted, in characters.  The longest
#: names in StableToolBench's solvable queries and tool docs are 40, 59 and 115 characters; a
#: longer name is refused (HTTP 422) before it reaches a table, a log line or the store.
MAX_NAME_CHARS = 1024

#: C0 controls, DEL and C1 controls (Unicode category Cc): never part of a tool's name
_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f]")


def _valid_name(name: str) -> str:
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"is {len(name)} characters long; at most {MAX_NAME_CHARS} characters are accepted")
    found = _CONTROL_CHARS.search(name)
    if found is not None:
        raise ValueError(f"contains the control character U+{ord(found.group()):04X} at position {found.start()}")
    return name


#: A name of a ``/virtual`` call: at most :data:`MAX_NAME_CHARS` characters, no control characters
Name = Annotated[str, AfterValidator(_valid_name)]


class VirtualRequest(BaseModel):
    """The body StableToolBench's client POSTs to ``/virtual``; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    category: Name
    tool_name: Name
    api_name: Name
    tool_input: str | dict
    strip: str = ""
    toolbench_key: str = ""

    @model_validator(mode="after")
    def _encodable(self) -> VirtualRequest:
        # JSON escapes such as "\ud800" decode to lone surrogates, which no store can encode
        text = self.tool_input if isinstance(self.tool_input, str) else ""
        try:  # every string field at once (the usual case; a lone surrogate stays one when joined)
            "".join((self.category, self.tool_name, self.api_name, self.strip, self.toolbench_key, text)).encode("utf-8")
        except UnicodeEncodeError:
            pass  # find which one, below
        else:
            if not isinstance(self.tool_input, dict) or is_encodable(self.tool_input):
                return self
        for name in ("category", "tool_name", "api_name", "strip", "toolbench_key", "tool_input"):
            if not is_encodable(getattr(self, name)):
                raise ValueError(f"{name} contains a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape)")
        return self


def is_encodable(value: Any) -> bool:
    """Whether every string in ``value`` (a JSON value) can be encoded as UTF-8."""
    try:
        if isinstance(value, str):
            value.encode("utf-8")
        else:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except (TypeError, ValueError, RecursionError):
        return True
    return True


class ToolInputParseError(ValueError):
    """The ``tool_input`` text is not JSON (upstream answers ``Tool input parse error...``)."""


def parse_tool_input(tool_input: str | dict) -> Any:
    """Parse ``tool_input`` like the upstream server: JSON text, ``""`` -> ``{}``, a dict as is.

    Any JSON value is accepted, as upstream does (the cache key is then ``str()`` of it).
    """
    if isinstance(tool_input, dict):
        return tool_input
    if tool_input == "":
        return {}
    try:
        parsed = json.loads(tool_input)
    except (ValueError, RecursionError) as exc:
        raise ToolInputParseError(str(exc)) from None
    if "\\u" in tool_input and not is_encodable(parsed):
        raise ToolInputParseError("a lone UTF-16 surrogate escape")
    return parsed
