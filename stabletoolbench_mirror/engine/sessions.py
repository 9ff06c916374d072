"""Sessions: a client's calls as one trajectory, with a task, a history and a local-tool state.

A client asks ``POST /sessions`` for a new id (128 random bits) and sends it in the header
``X-STM-Session: <id>`` on ``POST /virtual``.  An id the server did not issue is refused (HTTP
404) unless ``sessions.allow_client_ids`` (then an unknown id starts a session).  Whoever knows
an id owns the session: there is no other check.  Inside a session:

* a call's record keys carry the session's history hash (see :mod:`.keys`), so the same
  trajectory replays byte for byte and a call made in another state is not served an
  answer made for a different one;
* the simulator's prompt carries the task and the last ``simulator.history`` calls;
* local tools get the session's ``state`` dict, saved after each call.

A session is a head (task, history hash, state, the number and size of its calls) and its calls
as separate entries in the store (:mod:`.stores.sessions`): a call adds one entry and rewrites
the head, never the calls before it.  A session holds at most ``sessions.max_calls`` calls and
``sessions.max_bytes`` bytes, and is forgotten after ``sessions.idle_expiry_s`` without calls.
The calls of one session run one at a time (the record store's cross-process lock), so its
history is a sequence.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import unicodedata
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypedDict, cast

from stabletoolbench_mirror.config import SessionsConfig
from stabletoolbench_mirror.core.call import HistoryItem, SessionContext, ToolCall
from stabletoolbench_mirror.core.keys import history_next, history_start
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine.store_health import StoreHealth
from stabletoolbench_mirror.stores.base import StoreError
from stabletoolbench_mirror.stores.sessions import DOC_VERSION, SessionStore

log = logging.getLogger(__name__)

HEADER = "x-stm-session"
MAX_ID_CHARS = 128
MAX_TASK_CHARS = 20_000  # the longest ``task`` text ``POST /sessions`` accepts
#: random bits of an id issued by ``POST /sessions``
ID_BITS = 128
#: the record store's lock name space that serialises the calls of one session
LOCK_NAMESPACE = "stm-session"


class SessionError(Exception):
    """A session request that cannot be served: an HTTP status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a session id (``None`` when it can): 1-128 characters, no control characters."""
    if not value:
        return "a session id must not be empty"
    if len(value) > MAX_ID_CHARS:
        return f"a session id has at most {MAX_ID_CHARS} characters (got {len(value)})"
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        return "a session id must not contain control characters"
    return None


def check_id(value: str) -> str:
    """``value`` when it is a valid session id; else :class:`SessionError` (422)."""
    problem = id_problem(value)
    if problem is not None:
        raise SessionError(422, problem)
    return value


def unknown(session_id: str) -> SessionError:
    return SessionError(404, f"no session {session_id!r} (unknown, deleted or expired): session ids are issued by POST /sessions")


class SessionHead(TypedDict):
    """A session's head as stored (document version 2): everything but its calls (see :mod:`.stores.sessions`).

    A store may keep fields of its own beside these (the diskcache store: when the calls' expiry
    was last renewed); they travel along untouched.
    """

    v: int
    id: str
    task: str
    created_at: float
    updated_at: float
    history: str
    """The history hash after the calls that count (see :mod:`stabletoolbench_mirror.core.keys`)."""
    state: dict[str, Any]
    """The local tools' state: JSON."""
    n_calls: int
    calls_bytes: int
    """The size of the calls' entries in the store."""
    in_history: list[int]
    """The numbers of the calls that make the history (answered from a record or a local tool)."""


class SessionCall(TypedDict):
    """One call of a session's trajectory, an entry of its own in the store."""

    category: str
    tool_name: str
    api_name: str
    api: str
    tool_input: Any
    answer: Any
    source: str | None
    origin: str
    outcome: str
    in_history: bool
    history: str
    """The history hash the call was made in."""
    at: float


def new_head(session_id: str, task: str = "") -> SessionHead:
    """A new session's head (see :mod:`.stores.sessions`): no calls yet."""
    now = time.time()
    return {
        "v": DOC_VERSION,
        "id": session_id,
        "task": task,
        "created_at": now,
        "updated_at": now,
        "history": history_start(task),
        "state": {},
        "n_calls": 0,
        "calls_bytes": 0,
        "in_history": [],
    }


def _size(value: Any) -> int:
    return len(SessionStore.encode(value).encode("utf-8", "surrogatepass"))


def size_of(head: SessionHead) -> int:
    """The bytes a session takes in the store: its calls and its head."""
    return head["calls_bytes"] + _size(head)


# -- the session logic ----------------------------------------------------------------------------


Answer = Callable[[ToolCall, dict], Outcome]
"""Answers a call inside a session; may change the state dict it is given (local tools)."""


class Sessions:
    """Creates, reads and deletes sessions, and runs a call inside one."""

    def __init__(
        self,
        store: SessionStore,
        lock: Callable[[str], AbstractContextManager[None]],
        config: SessionsConfig,
        *,
        history: int,
    ) -> None:
        self.store = store
        self.lock = lock
        self.config = config
        self.history = history

    def create(self, task: str = "") -> SessionHead:
        if len(task) > MAX_TASK_CHARS:
            raise SessionError(422, f"task: at most {MAX_TASK_CHARS} characters (got {len(task)})")
        head = new_head(secrets.token_hex(ID_BITS // 8), task)  # a new id: ID_BITS random bits as hex
        if not self.store.create(head):  # pragma: no cover - 128 random bits
            raise SessionError(409, "session id already taken; retry")
        return head

    def get(self, session_id: str) -> dict[str, Any]:
        doc = self.store.load(check_id(session_id))
        if doc is None:
            raise unknown(session_id)
        return doc

    def delete(self, session_id: str) -> None:
        if not self.store.delete(check_id(session_id)):
            raise unknown(session_id)

    def _over(self, session_id: str, size: int) -> SessionError:
        limit = self.config.max_bytes
        return SessionError(
            409,
            f"session {session_id!r} is full: with this call it would hold {size} bytes, over sessions.max_bytes={limit} "
            "(start a new session with POST /sessions, or raise sessions.max_bytes)",
        )

    def run(self, session_id: str, call: ToolCall, answer: Answer, health: StoreHealth) -> Outcome:
        """Answer ``call`` inside the session and add it to the trajectory.

        :class:`SessionError` when the session is unknown (and ``sessions.allow_client_ids`` is
        off) or full; :class:`~.stores.StoreError` when the store cannot be read.  When only
        the call's entry cannot be written (a full disk), the answer is served as ``unrecorded``
        and ``health`` told.
        """
        check_id(session_id)
        with self.lock(session_id):
            head = self._head(session_id)
            n = head["n_calls"]
            if n >= self.config.max_calls:
                raise SessionError(409, f"session {session_id!r} is full: it holds sessions.max_calls={self.config.max_calls} calls")
            tool_input = call.tool_input  # its secret fields were taken out when the call was built
            # a call whose input alone does not fit is refused before it runs
            if size_of(head) + _size(tool_input) > self.config.max_bytes:
                raise self._over(session_id, size_of(head) + _size(tool_input))
            history = head["history"]
            state = head["state"]  # just decoded: the head is this call's own
            outcome = answer(call.in_session(history, self._context(session_id, head)), state)
            if outcome.status != 200:
                return outcome  # not an answer to the call (overloaded, store down): not part of the trajectory
            # answers from a record or a local tool (they have a source) make the history; failures do not
            # (a failure record replayed is no more part of it than the failure was when recorded)
            counts = outcome.source is not None and not outcome.failure
            entry = _entry(call, outcome, history, counts)
            head = {
                **head,
                "n_calls": n + 1,
                "calls_bytes": head["calls_bytes"] + _size(entry),
                "in_history": [*head["in_history"], n] if counts else list(head["in_history"]),
                "history": history_next(history, call.api, call.canonical, outcome.body) if counts else history,
                "state": state,
                "updated_at": time.time(),
            }
            if size_of(head) > self.config.max_bytes:
                log.warning("session %r: a call's answer not kept, over sessions.max_bytes=%d", session_id, self.config.max_bytes)
                raise self._over(session_id, size_of(head))
            return self._keep(session_id, head, entry, outcome, health)

    def _head(self, session_id: str) -> SessionHead:
        """The session's head, read; a new one for an unknown id when ``sessions.allow_client_ids`` is on."""
        # a head the store read: written by new_head and run (or split from an older document by the store, which fills
        # the same fields)
        raw = self.store.load_head(session_id)
        if raw is not None:
            return cast(SessionHead, raw)
        if not self.config.allow_client_ids:
            raise unknown(session_id)
        head = new_head(session_id)
        if not self.store.create(head):  # started by another process meanwhile
            raw = self.store.load_head(session_id)
            head = cast(SessionHead, raw) if raw is not None else head
        return head

    def _context(self, session_id: str, head: SessionHead) -> SessionContext:
        """The task and the last ``history`` calls of the trajectory, for a simulator's prompt."""
        window = head["in_history"][-self.history:] if self.history > 0 else []
        recent = self.store.calls(session_id, window)
        return SessionContext(
            task=head["task"],
            history=tuple(HistoryItem(s["api"], s["api_name"], s["tool_input"], s["answer"]) for s in recent),
            id=session_id,
        )

    def _keep(self, session_id: str, head: SessionHead, entry: SessionCall, outcome: Outcome, health: StoreHealth) -> Outcome:
        """Write the call's entry and the new head; the outcome served (``unrecorded`` when only that write failed)."""
        try:
            kept = self.store.append(head, entry)
        except StoreError as exc:
            # a full disk: the answer is served as a plain miss's would be (unrecorded, /health degraded)
            health.failed("session write", exc, unrecorded=outcome.kind != OutcomeKind.UNRECORDED)
            log.warning("session %r: the call's answer is served but not kept in the session: %s", session_id, exc)
            return replace(outcome, kind=OutcomeKind.UNRECORDED)
        health.succeeded("session write")
        if not kept:
            log.info("session %r was deleted while a call ran; its answer is served, not kept", session_id)
        return outcome

    def close(self) -> None:
        self.store.close()


def _entry(call: ToolCall, outcome: Outcome, history: str, counts: bool) -> SessionCall:
    """The trajectory's entry of one answered call (``counts``: it is part of the history)."""
    try:
        parsed = json.loads(outcome.body)
    except ValueError:  # pragma: no cover - every body is JSON
        parsed = outcome.body
    return {
        "category": call.category,
        "tool_name": call.tool_name,
        "api_name": call.api_name,
        "api": call.api,
        "tool_input": call.tool_input,
        "answer": parsed,
        "source": outcome.source,
        "origin": outcome.origin,
        "outcome": outcome.kind,
        "in_history": counts,
        "history": history,
        "at": time.time(),
    }


def public_view(doc: dict[str, Any]) -> dict[str, Any]:
    """A session as ``GET /sessions/{id}`` and the export show it."""
    return {
        "id": doc["id"],
        "task": doc.get("task", ""),
        "created_at": doc.get("created_at"),
        "updated_at": doc.get("updated_at"),
        "calls": doc.get("calls", []),
        "state": doc.get("state", {}),
    }
