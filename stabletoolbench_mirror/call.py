"""A ``/virtual`` request resolved into the call the layer works with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .keys import canonical_key, upstream_key
from .naming import CallNames, resolve_names
from .protocol import VirtualRequest, parse_tool_input


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
    """Upstream cache key: ``str(tool_input)``."""
    canonical: str
    """Order-insensitive key (see :mod:`stabletoolbench_mirror.keys`)."""
    strip: str = ""
    toolbench_key: str = field(default="", repr=False)
    """A secret: never logged, recorded or echoed."""

    @property
    def api(self) -> str:
        return self.names.api

    @classmethod
    def build(cls, request: VirtualRequest, tool_input: Any, names: CallNames | None = None) -> "ToolCall":
        """The call of ``request`` with its already parsed ``tool_input``."""
        return cls(
            names=names or resolve_names(request.category, request.tool_name, request.api_name),
            category=request.category,
            tool_name=request.tool_name,
            api_name=request.api_name,
            tool_input=tool_input,
            key=upstream_key(tool_input),
            canonical=canonical_key(tool_input),
            strip=request.strip,
            toolbench_key=request.toolbench_key,
        )

    @classmethod
    def from_request(cls, request: VirtualRequest) -> "ToolCall":
        """Resolve a request; raise :class:`~stabletoolbench_mirror.protocol.ToolInputParseError` on bad input."""
        return cls.build(request, parse_tool_input(request.tool_input))

    @classmethod
    def of(cls, category: str, tool_name: str, api_name: str, tool_input: Any, **extra: str) -> "ToolCall":
        """A call from its parts (warming, checks, tests)."""
        request = VirtualRequest(category=category, tool_name=tool_name, api_name=api_name, tool_input="", **extra)
        return cls.build(request, tool_input)
