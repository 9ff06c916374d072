"""A ``/virtual`` request resolved into the call the layer works with."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from stabletoolbench_mirror.core.keys import canonical_key, record_key, session_key, upstream_key
from stabletoolbench_mirror.core.naming import CallNames, resolve_names
from stabletoolbench_mirror.core.protocol import VirtualRequest, parse_tool_input
from stabletoolbench_mirror.core.secrets import may_name_a_secret_field, without_secret_fields


@dataclass(frozen=True)
class HistoryItem:
    """One earlier call of a session, as a prompt shows it."""

    api: str
    api_name: str
    tool_input: Any
    answer: Any


@dataclass(frozen=True)
class SessionContext:
    """What a simulator prompt sees of a session (:mod:`..engine.sessions`): the task and the last calls
    (oldest first); and, for tools that run here (API-Bank's environments), the session's id."""

    task: str
    history: tuple[HistoryItem, ...]
    id: str = ""


@dataclass(frozen=True)
class ToolCall:
    """One tool call with StableToolBench's names, the parsed input and its cache keys."""

    names: CallNames
    category: str
    """The category as the client sent it."""
    tool_name: str
    """The tool name as the client sent it."""
    api_name: str
    """The API name as the client sent it."""
    tool_input: Any
    """The parsed input (normally a dict)."""
    key: str
    """The record key in the writable store: upstream's ``str(tool_input)``, kind-marked for a string
    input that reads like another kind's key (:func:`~stabletoolbench_mirror.core.keys.record_key`)."""
    canonical: str
    """Order-insensitive key (see :mod:`stabletoolbench_mirror.core.keys`)."""
    upstream: str = ""
    """Upstream's own key, ``str(tool_input)``: frozen trees are looked up with it as upstream does
    (after :attr:`key`, which a snapshot of this project's store holds).  Inside a session, :attr:`key`."""
    strip: str = ""
    toolbench_key: str = field(default="", repr=False)
    """A secret: never logged, recorded or echoed."""
    session: SessionContext | None = field(default=None, repr=False, compare=False)
    """Inside a session: its task and recent history (for prompts); ``key`` and ``canonical`` then carry the history hash."""
    sessionless: ToolCall | None = field(default=None, repr=False, compare=False)
    """Inside a session: the same call outside any session (upstream's keys), which frozen caches are also read with."""

    def in_session(self, history: str, context: SessionContext) -> ToolCall:
        """This call as made inside a session whose history hash is ``history`` (see :mod:`.keys`)."""
        key = session_key(self.key, history)
        return replace(self, key=key, canonical=session_key(self.canonical, history), upstream=key, session=context,
                       sessionless=self.sessionless or self)

    @property
    def api(self) -> str:
        return self.names.api

    @classmethod
    def build(cls, request: VirtualRequest, tool_input: Any, names: CallNames | None = None) -> ToolCall:
        """The call of ``request`` with its already parsed ``tool_input`` (secret fields taken out)."""
        upstream = upstream_key(tool_input)
        if may_name_a_secret_field(upstream):  # a substring test first: the walk is for the rare input that may
            scrubbed = without_secret_fields(tool_input)
            if scrubbed is not tool_input:
                tool_input, upstream = scrubbed, upstream_key(scrubbed)
        return cls(
            names=names or resolve_names(request.category, request.tool_name, request.api_name),
            category=request.category,
            tool_name=request.tool_name,
            api_name=request.api_name,
            tool_input=tool_input,
            key=record_key(tool_input, upstream),
            canonical=canonical_key(tool_input),
            upstream=upstream,
            strip=request.strip,
            toolbench_key=request.toolbench_key,
        )

    @classmethod
    def from_request(cls, request: VirtualRequest) -> ToolCall:
        """Resolve a request; raise :class:`~stabletoolbench_mirror.core.protocol.ToolInputParseError` on bad input."""
        return cls.build(request, parse_tool_input(request.tool_input))

    @classmethod
    def of(cls, category: str, tool_name: str, api_name: str, tool_input: Any, **extra: str) -> ToolCall:
        """A call from its parts (warming, checks, tests)."""
        request = VirtualRequest(category=category, tool_name=tool_name, api_name=api_name, tool_input="", **extra)
        return cls.build(request, tool_input)
