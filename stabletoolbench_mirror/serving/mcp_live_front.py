"""The live MCP servers (``mcp_servers``) at ``/mcp``: their recorded listings in pages, their calls as ``CallToolResult`` s.

:class:`LiveFront` is what :class:`~.mcp_front.McpFront` asks when ``mcp_servers`` is set: ``/mcp`` lists
the live servers' tools (as their servers listed them, a name two servers list prefixed with its server's,
:func:`~stabletoolbench_mirror.responders.mcp_live.tools.offered_tools`) in the same pages as StableToolBench's
(:class:`~.mcp_catalog.Catalog`), and a call goes the live path
(:class:`~stabletoolbench_mirror.responders.mcp_live.calls.LiveCalls`).  The run of a call's occurrences is its
MCP session's server session (or ``X-STM-Session``'s), else the server's own run (``llm.run``'s).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from stabletoolbench_mirror.config import ConfigError, McpServerConfig, Mode, Settings, read_mcp_servers
from stabletoolbench_mirror.core import fair, protocol
from stabletoolbench_mirror.core.outcomes import Outcome
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.responders.mcp_live.calls import LiveCalls, error_result
from stabletoolbench_mirror.responders.simulator.responder import Simulator
from stabletoolbench_mirror.serving.admission import Refused
from stabletoolbench_mirror.serving.mcp_catalog import Catalog
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

log = logging.getLogger(__name__)


def _recorded_servers(layer: MirrorLayer) -> dict[str, McpServerConfig]:
    """In ``replay`` without ``mcp_servers``: the servers of the first frozen snapshot whose manifest's settings name
    some (a snapshot of an MCP run is served alone: its servers' matchers and ignored fields are its manifest's)."""
    if layer.mode is not Mode.REPLAY:
        return {}
    for tier in layer.frozen:
        manifest = getattr(tier, "root", None)
        path = Path(manifest) / MANIFEST_NAME if manifest is not None else None
        if path is None or not path.is_file():
            continue
        try:
            recorded = json.loads(path.read_text(encoding="utf-8")).get("settings", {}).get("mcp_servers")
            servers = read_mcp_servers(recorded, str) if isinstance(recorded, dict) and recorded else {}
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("%s: its mcp_servers cannot be read (%s)", path, exc)
            continue
        if servers:
            log.info("live MCP servers replayed from %s: %s", path, ", ".join(servers))
            return servers
    return {}


class LiveFront:
    """The live servers' tools and calls as the MCP front serves them."""

    def __init__(self, calls: LiveCalls) -> None:
        self.calls = calls
        self.catalog = Catalog.of_tools([])

    @classmethod
    def build(cls, settings: Settings, layer: MirrorLayer, run: str, limiter: Any = None) -> LiveFront | None:
        """The live front of ``mcp_servers`` (``None`` without any); :class:`ConfigError` naming the key when they are wrong."""
        servers = settings.live_servers() or _recorded_servers(layer)
        if not servers:
            return None
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ConfigError("mcp_servers: live MCP servers need the official MCP SDK: pip install 'stabletoolbench-mirror[mcp]'") from None
        simulator = next((r for r in layer.responders if isinstance(r, Simulator)), None)
        calls = LiveCalls(servers, layer.store, mode=layer.mode, stats=layer.stats, run=run, frozen=layer.frozen, simulator=simulator,
                          save=settings.save, store_timeout_s=settings.store.timeout_s, limiter=limiter,
                          redactor=Redactor(settings.secrets()), faults=layer.faults)
        return cls(calls)

    def start(self) -> None:
        """Read the servers' listings (live ones started); in a worker thread, before ``/mcp`` is served."""
        import mcp_types as types

        self.calls.start()
        tools = []
        for tool in self.calls.tools.values():
            try:
                tools.append(types.Tool.model_validate(tool.offered_tool()))
            except ValueError as exc:
                log.warning("MCP server %r: its tool %r is not a valid MCP tool, left out (%s)", tool.server, tool.name[:80],
                            str(exc).splitlines()[0][:200])
        self.catalog = Catalog.of_tools(tools)

    def offers(self, name: str) -> bool:
        return name in self.calls.tools

    def page(self, cursor: str | None) -> Any:
        return self.catalog.page(None, cursor)

    async def call(self, name: str, arguments: dict[str, Any], session: str | None, local: bool = True) -> Any:
        """The ``CallToolResult`` of one call (an MCP error result when a recorded one is no longer valid).  ``local``:
        the session is this process's own (an MCP session's; ``X-STM-Session`` names one other processes may share)."""
        import mcp_types as types

        text = await self.calls.call(name, arguments, session, local)
        try:
            if text is None:
                return types.CallToolResult.model_validate(error_result(f"no tool {name!r}"))
            return types.CallToolResult.model_validate_json(text)
        except ValueError as exc:
            message = f"stabletoolbench-mirror: the answer of {name[:80]!r} is not a valid CallToolResult ({str(exc).splitlines()[0][:200]})"
            return types.CallToolResult.model_validate(error_result(message))

    async def direct(self, body: bytes, accept: str, session: Any) -> bytes | None:
        """The JSON-RPC answer (``application/json``) to a handshake-era session's ``tools/call`` of a live tool, answered
        here without the SDK's session machinery; ``None`` for any other message (the SDK answers it).

        A replay's hit is most of what a live-MCP benchmark asks, and the SDK's streamable-HTTP path (the message
        into the session's streams, its task, the answer back as a server-sent event) cost more than the rest of
        the call (``benchmarks/live_mcp.py``).  Only a single request whose method is ``tools/call``, naming a
        tool offered here with object arguments, from a client that accepts JSON, is answered here; the result is
        the one the SDK path serves (the same ``CallToolResult``, dumped as the SDK dumps it).  ``session``: made
        only for such a call, an awaitable giving its server session (or the answer to a bad ``X-STM-Session``)."""
        message = self._live_call_of(body, accept)
        if message is None:
            return None
        params = message["params"]
        run, local = await session()
        if isinstance(run, Outcome):
            text: str | None = encode_answer(error_result(f"stabletoolbench-mirror: {run.answer['error']}"))
        else:
            text = await self.calls.call(params["name"], params.get("arguments") or {}, run, local)
        # the result as recorded (a CallToolResult dumped as the SDK dumps one), spliced into the JSON-RPC answer
        head = '{"jsonrpc":"2.0","id":' + json.dumps(message["id"], ensure_ascii=False) + ',"result":'
        return (head + (text or "{}") + "}").encode("utf-8")

    def _live_call_of(self, body: bytes, accept: str) -> dict[str, Any] | None:
        """The JSON-RPC message of a ``tools/call`` of a live tool, from a client that accepts JSON; else ``None``."""
        if b"tools/call" not in body or "application/json" not in accept:
            return None
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            return None
        params = message.get("params") if isinstance(message, dict) else None
        if not isinstance(params, dict) or message.get("jsonrpc") != "2.0" or message.get("method") != "tools/call":
            return None
        ok = (isinstance(message.get("id"), (str, int)) and isinstance(params.get("name"), str) and self.offers(params["name"])
              and isinstance(params.get("arguments") or {}, dict))
        return message if ok else None

    def close(self) -> None:
        self.calls.close()


async def answer_directly(live: LiveFront, scope: Any, receive: Any, send: Any, sid: str, admission: Any,
                          session_of: Any, limit: int) -> tuple[Any, int | None]:
    """A handshake-era session's POST answered by :meth:`LiveFront.direct` when it is a live tool's call: its status,
    else ``None`` and the ``receive`` that hands the SDK the body read here.  A body over ``limit`` is refused (HTTP 413)."""
    body = await _body(receive, limit)
    if body is None:
        await JSONResponse(protocol.answer(f"request body larger than {limit} bytes", ""), status_code=413)(scope, receive, send)
        return receive, 413
    headers = Headers(scope=scope)
    client = scope["client"][0] if scope.get("client") else "?"
    fair.CLIENT.set(client)  # the worker threads shared fairly between clients, as /virtual's
    answer = None
    try:
        if admission is not None:
            await admission.enter(client)  # a slot among the client's in-flight calls, as /virtual's
    except Refused:
        pass  # over the client's limits: the SDK's path answers it, refused there as any MCP call
    else:
        try:
            answer = await live.direct(body, headers.get("accept", ""), lambda: session_of(headers, sid))
        finally:
            if admission is not None:
                admission.leave(client)
    if answer is not None:  # the answer's two ASGI messages as Starlette's Response sends them, without building one
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json"),
            (b"mcp-session-id", sid.encode("latin-1"))]})
        await send({"type": "http.response.body", "body": answer})
        return receive, 200
    sent = [False]

    async def replay() -> Any:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay, None


async def _body(receive: Any, limit: int) -> bytes | None:
    """A request's whole body, or ``None`` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body"):
            return b"".join(chunks)

