"""API-Bank's APIs as local tools: found by name, run in the session's environment, answered as JSON.

:class:`ApiBankTools` is a :class:`~stabletoolbench_mirror.engine.local_tools.LocalTools` (the
layer's hook for tools that run here): the ``local_tools`` files' tools run as before, and a
call to category ``APIBank``, tool ``API-Bank`` (``API-Bank Level-3`` for ``lv3_apis``), API =
a class name runs that class's ``call`` with its inputs typed (:mod:`.inputs`) in the session's
:class:`~.environment.Environment`.  The answer is ``{"error": "", "response": <the JSON text of
what call returned>}`` (``{"api_name", "input", "output", "exception"}``); an input ToolManager
refuses, or a ``call`` that raises, gets the same form with the reason as ``exception`` and
changes nothing.  APIs that do not run here (:mod:`.loader`) are not local tools: their calls
take the normal miss path.
"""

from __future__ import annotations

import ctypes
import json
import logging
import threading
from typing import Any

from cachetools import LRUCache

from stabletoolbench_mirror.apibank.environment import Environment, StateError, call_rng, seeded
from stabletoolbench_mirror.apibank.inputs import InputError, type_inputs
from stabletoolbench_mirror.apibank.loader import Suite
from stabletoolbench_mirror.apibank.tables import json_default
from stabletoolbench_mirror.config import ConfigError
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.naming import resolve_names
from stabletoolbench_mirror.engine.local_tools import LocalResult, LocalTool, LocalTools

log = logging.getLogger(__name__)

CATEGORY = "APIBank"
TOOL_NAMES = {"apis": "API-Bank", "lv3_apis": "API-Bank Level-3"}
#: live environments kept per process (older ones are rebuilt from their session's state)
MAX_LIVE = 256
#: session locks kept (a session's calls run one at a time; different sessions' at once)
MAX_SESSION_LOCKS = 4 * MAX_LIVE


class CallOverrun(BaseException):
    """Raised in the thread of an API-Bank call still running past ``local_tools_timeout_s``: it ends the call.

    A ``BaseException``: API-Bank's own ``except Exception`` (``Calculator.call``'s) does not catch it.
    """


def _end_thread(ident: int) -> None:
    """End the call running in thread ``ident`` at its next bytecode (Python code; a long C call ends after it)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(CallOverrun))


def state_key(suite: Suite) -> str:
    """Where a suite's environment is kept in a session's state."""
    return "apibank" if suite.folder == "apis" else f"apibank-{suite.folder}"


def seed_of(call: ToolCall) -> str:
    """A session's seed: its task (the same dialogue gives the same ids every run), else its id; outside a session, none."""
    context = call.session
    if context is None:
        return "no session"
    return f"task:{context.task}" if context.task else f"id:{context.id}"


def _exception_answer(name: str, tool_input: Any, why: str) -> dict[str, Any]:
    return {"api_name": name, "input": tool_input, "output": None, "exception": why}


class ApiBankTools(LocalTools):
    """The ``local_tools`` files' tools and API-Bank's (see the module doc)."""

    def __init__(self, suites: list[Suite], tools: dict[str, LocalTool] | None = None, **options: Any) -> None:
        merged = dict(tools or {})
        self.bank: dict[str, tuple[Suite, str]] = {}
        """API (``APIBank/api_bank_for_APIBank/addagenda``) -> its suite and class name."""
        for suite in suites:
            for name in suite.local:
                api = resolve_names(CATEGORY, suite.tool_name, name).api
                if api in merged or api in self.bank:
                    raise ConfigError(f"apibank: the API {name} of {suite.folder}/ is {api}, which another tool already defines")
                self.bank[api] = (suite, name)
                merged[api] = LocalTool(api, _not_called, f"apibank:{suite.folder}")
        super().__init__(merged, **options)
        self._live: LRUCache[tuple[str, str], Environment] = LRUCache(MAX_LIVE)
        self._live_lock = threading.Lock()
        self._session_locks: LRUCache[tuple[str, str], threading.Lock] = LRUCache(MAX_SESSION_LOCKS)

    # -- environments ---------------------------------------------------------------------------

    def _environment(self, suite: Suite, call: ToolCall, state: dict) -> Environment:
        seed = seed_of(call)
        if call.session is None:
            return Environment(suite, seed)
        kept = state.get(state_key(suite))
        key = (suite.folder, call.session.id)
        with self._live_lock:
            live = self._live.get(key)
        if live is not None and kept is not None and live.matches(kept):
            return live
        if kept is None:
            return Environment(suite, seed)
        return Environment.restore(suite, seed, kept)

    def _keep(self, suite: Suite, call: ToolCall, env: Environment) -> None:
        if call.session is None:
            return
        with self._live_lock:
            self._live[(suite.folder, call.session.id)] = env

    def _forget(self, suite: Suite, call: ToolCall) -> None:
        if call.session is not None:
            with self._live_lock:
                self._live.pop((suite.folder, call.session.id), None)

    def live(self, folder: str, session_id: str) -> Environment | None:
        """The live environment of a session (for tests and reports), if this process has one."""
        with self._live_lock:
            return self._live.get((folder, session_id))

    # -- a call ---------------------------------------------------------------------------------

    def run(self, tool: LocalTool, call: ToolCall, state: dict) -> LocalResult:
        found = self.bank.get(tool.api)
        if found is None:
            return super().run(tool, call, state)
        suite, name = found
        running: dict[str, Any] = {}

        def work() -> LocalResult:
            running["thread"] = threading.get_ident()
            try:
                return self._call(suite, name, call, state)
            finally:
                running["done"] = True

        returned, result = self.in_thread(f"API-Bank {name}", work)
        if not returned:
            self._forget(suite, call)  # not run, or did not return: its next call rebuilds the environment from the state
            if "thread" in running and "done" not in running:
                _end_thread(running["thread"])  # past local_tools_timeout_s: ended, so it holds no CPU and no session lock
        ran: LocalResult = result
        return ran

    def _session_lock(self, suite: Suite, call: ToolCall) -> threading.Lock:
        key = (suite.folder, call.session.id if call.session is not None else "")
        with self._live_lock:
            lock = self._session_locks.get(key)
            if lock is None:
                lock = self._session_locks[key] = threading.Lock()
        return lock

    def _call(self, suite: Suite, name: str, call: ToolCall, state: dict) -> LocalResult:
        tool_input = call.tool_input if isinstance(call.tool_input, dict) else {}
        if not isinstance(call.tool_input, dict):
            return self._answer(_exception_answer(name, call.tool_input, "the input must be an object of named parameters"), state)
        try:
            kwargs = type_inputs(tool_input, suite.apis[name].input_parameters)
        except InputError as exc:
            return self._answer(_exception_answer(name, tool_input, str(exc)), state)
        # a session's calls run one at a time (its environment is one); other sessions' calls never wait for it
        lock = self._session_lock(suite, call) if call.session is not None else threading.Lock()
        if not lock.acquire(timeout=self.timeout_s):
            raise TimeoutError("an earlier call of this session is still running")
        try:
            try:
                env = self._environment(suite, call, state)
            except StateError as exc:
                return LocalResult(None, detail=f"the session's {state_key(suite)} state: {exc}")
            try:
                with seeded(suite.modules, call_rng(env.seed, env.n)):
                    result = env.instance(name).call(**kwargs)
                    text = json.dumps(result, default=json_default, ensure_ascii=False)
            except Exception as exc:  # noqa: BLE001 - as ToolManager's evaluator, a call that raises is a failed call
                self._forget(suite, call)
                why = f"{type(exc).__name__}: {exc}"[:500]
                log.info("API-Bank %s raised %s", name, why)
                return self._answer(_exception_answer(name, tool_input, why), state)
            env.n += 1
            snapshot = env.snapshot()
        finally:
            lock.release()
        self._keep(suite, call, env)
        return LocalResult(protocol.answer("", text), {**state, state_key(suite): snapshot})

    @staticmethod
    def _answer(value: dict[str, Any], state: dict) -> LocalResult:
        return LocalResult(protocol.answer("", json.dumps(value, default=json_default, ensure_ascii=False)), dict(state))


def _not_called(tool_input: Any, state: dict) -> Any:  # pragma: no cover - ApiBankTools.run answers these itself
    raise RuntimeError("API-Bank tools are run by ApiBankTools.run")
