"""Local tools (API-Bank style): Python functions from the files listed in ``local_tools``.

Only the listed files are imported, once, at start; nothing derived from a request is ever
imported or evaluated: a call only looks its names up in the ``TOOLS`` tables.  Each file
defines::

    TOOLS = {"Category/tool_name/api_name": fn, ...}   # fn(tool_input: dict, state: dict) -> value

The names are matched after StableToolBench's standardisation (the cache file of the API), so
``"Meetings/Meeting Planner/Add Meeting"`` answers calls with ``tool_name: "Meeting Planner"``
and ``api_name: "add_meeting"``.  The answer is:

* a dict with both ``error`` and ``response``: served as it is;
* anything else: ``{"error": "", "response": <text>}``; a string is the text, any other value
  its JSON text (``{"id": 1}`` -> ``'{"id": 1}'``, ``3`` -> ``'3'``, ``True`` -> ``'true'``).

``state`` is the session's own JSON dict (an empty one per call outside a session); the
changes a tool makes are kept only when it returns in time with a JSON-serialisable state.
A tool runs in its own thread and is waited for ``local_tools_timeout_s`` seconds; a Python
thread cannot be killed, so a tool that never returns keeps its thread (at most
:data:`MAX_RUNNING` such threads, then further local calls are refused with an error answer).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.naming import ApiPath, resolve_names

log = logging.getLogger(__name__)

#: local tool threads running (or stuck) at once in one process
MAX_RUNNING = 32
MAX_STATE_BYTES = 1_048_576  # the largest local-tool state (as JSON) one session may keep

ToolFunction = Callable[[Any, dict], Any]


@dataclass(frozen=True)
class LocalTool:
    api: str
    fn: ToolFunction
    origin: str
    """``local:<file name>``: where the answer came from (recorded as the origin)."""


@dataclass(frozen=True)
class LocalResult:
    """A tool's run: ``answer`` and the new ``state`` when it worked, else ``answer is None`` and ``detail``."""

    answer: Any | None
    state: dict | None = None
    detail: str = ""


def answer_of(value: Any) -> Any:
    """The ``{"error", "response"}`` answer of a tool's return value (see the module doc)."""
    if isinstance(value, dict) and "error" in value and "response" in value:
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return protocol.answer("", text)


def _module_name(path: str) -> str:
    import hashlib

    digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    return f"stm_local_tools_{stem}_{digest}"


def import_tools_file(path: str) -> dict[str, LocalTool]:
    """The tools of one file, by API (``Category/tool_folder/api_name``); :class:`ConfigError` naming the file when it cannot be used."""
    where = f"local_tools: {path}"
    if not path.endswith(".py"):
        raise ConfigError(f"{where}: not a .py file")
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file")
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a spec
        raise ConfigError(f"{where}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a user's file may raise anything, SystemExit included
        sys.modules.pop(name, None)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        raise ConfigError(f"{where}: cannot be imported: {detail}") from None
    table = getattr(module, "TOOLS", None)
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: defines no TOOLS dict (\"Category/tool_name/api_name\" -> function)")
    origin = f"local:{os.path.basename(path)}"
    tools: dict[str, LocalTool] = {}
    for key, fn in table.items():
        named = ApiPath.parse(key) if isinstance(key, str) else None
        if named is None or not all(p.strip() for p in (named.category, named.tool, named.name)):
            raise ConfigError(f"{where}: TOOLS key {key!r} is not \"Category/tool_name/api_name\"")
        if not callable(fn):
            raise ConfigError(f"{where}: TOOLS[{key!r}] is not a function")
        api = resolve_names(named.category, named.tool, named.name).api
        if api in tools:
            raise ConfigError(f"{where}: TOOLS keys {key!r} and another one name the same API {api}")
        tools[api] = LocalTool(api, fn, origin)
    return tools


class LocalTools:
    """The local tools of the listed files, and running one with a timeout."""

    def __init__(self, tools: dict[str, LocalTool], *, timeout_s: float = 10.0) -> None:
        self.tools = dict(tools)
        self.timeout_s = float(timeout_s)
        self._slots = threading.BoundedSemaphore(MAX_RUNNING)

    @classmethod
    def load(cls, paths: list[str], **options: Any) -> LocalTools:
        tools: dict[str, LocalTool] = {}
        for path in paths:
            for api, tool in import_tools_file(path).items():
                if api in tools:
                    raise ConfigError(f"local_tools: {path} and {tools[api].origin[6:]} both define {api}")
                tools[api] = tool
        return cls(tools, **options)

    def __len__(self) -> int:
        return len(self.tools)

    def find(self, call: ToolCall) -> LocalTool | None:
        return self.tools.get(call.api)

    def run(self, tool: LocalTool, call: ToolCall, state: dict) -> LocalResult:
        """Run ``tool`` on a copy of the input and of ``state``; never raises, never waits past the timeout."""
        try:
            tool_input = copy.deepcopy(call.tool_input)
            work_state = copy.deepcopy(state)
        except RecursionError:
            log.error("local tool %s not run: its input or state is nested too deeply to copy", tool.api)
            return LocalResult(None, detail="not run: its input or state is nested too deeply to copy")
        returned, value = self.in_thread(f"local tool {tool.api}", lambda: tool.fn(tool_input, work_state))
        if not returned:
            failed: LocalResult = value
            return failed
        try:
            answer = answer_of(value)
            body = protocol.encode_answer(answer)
        except (TypeError, ValueError, RecursionError) as exc:
            log.error("local tool %s returned a value that is not JSON: %s", tool.api, exc)
            return LocalResult(None, detail=f"returned a value that is not JSON: {exc}"[:300])
        if not protocol.is_encodable(answer):
            return LocalResult(None, detail="returned a lone UTF-16 surrogate")
        try:
            state_text = json.dumps(work_state, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            log.error("local tool %s left a state that is not JSON: %s", tool.api, exc)
            return LocalResult(None, detail=f"left a state that is not JSON: {exc}"[:300])
        if not isinstance(work_state, dict) or len(state_text.encode("utf-8", "surrogatepass")) > MAX_STATE_BYTES:
            log.error("local tool %s left a state over %d bytes (local_tools.MAX_STATE_BYTES)", tool.api, MAX_STATE_BYTES)
            return LocalResult(None, detail=f"left a state over {MAX_STATE_BYTES} bytes")
        return LocalResult(json.loads(body), json.loads(state_text))

    def in_thread(self, label: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``fn`` in a thread of its own, holding one of :data:`MAX_RUNNING` slots until it returns.

        ``(True, what it returned)``, or ``(False, the LocalResult of a run that did not return)``: no
        free slot, no thread, past ``local_tools_timeout_s`` (the thread keeps running, and its slot),
        or an exception.  Never raises; ``label`` names the run in the log (``local tool <api>``).
        """
        if not self._slots.acquire(blocking=False):
            log.error("%s not run: %d local tools are still running (stuck past their timeout?)", label, MAX_RUNNING)
            return False, LocalResult(None, detail=f"{MAX_RUNNING} local tools still running")
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - a user's tool (or API-Bank's code) may raise anything
                box["error"] = f"{type(exc).__name__}: {exc}"[:300]
                box["trace"] = traceback.format_exc()
            finally:
                done.set()
                self._slots.release()

        # the slot is the thread's once it started (it gives it back when ``fn`` returns); before that, ours
        try:
            threading.Thread(target=target, name=label, daemon=True).start()
        except BaseException as exc:
            self._slots.release()
            if not isinstance(exc, RuntimeError):  # "can't start new thread" is an answer; anything else is not
                raise
            log.error("%s not run: %s", label, exc)
            return False, LocalResult(None, detail=f"not run: {exc}"[:300])
        if not done.wait(self.timeout_s):
            log.error("%s did not return within local_tools_timeout_s=%gs (its thread keeps running)", label, self.timeout_s)
            return False, LocalResult(None, detail=f"did not answer within {self.timeout_s:g}s")
        if "error" in box:
            log.error("%s raised:\n%s", label, box["trace"].rstrip())
            return False, LocalResult(None, detail=f"raised {box['error']}")
        return True, box["value"]

    def error_answer(self, tool: LocalTool, detail: str) -> dict[str, Any]:
        """The answer a failed run gets: upstream's failed-call text (status 6 for the client) and why."""
        return protocol.answer(protocol.API_NOT_WORKING, f"stabletoolbench-mirror: local tool {tool.api} {detail} (see the server log).")
