"""The MCP front: the layer's APIs as MCP tools, over streamable HTTP (``/mcp``) or stdio (the ``mcp`` command).

Built on the official MCP Python SDK (the ``mcp`` extra).  The tools are StableToolBench's functions
(:mod:`stabletoolbench_mirror.upstream.functions`): those of the queries in ``mcp.queries`` (or of
every tool in ``tools_folder`` without queries) at ``/mcp``, and one query's at
``/mcp/queries/<group>/<query_id>``.  ``Finish`` is not offered (it ends an agent's run, it calls
nothing).  A name upstream gives to more than one API in a list is offered with the suffix of
:func:`~stabletoolbench_mirror.upstream.functions.clash_name`.

A tool call is the ``/virtual`` call upstream's client makes for that function, with
``tool_input = json.dumps(arguments)``, answered by the same coroutine as ``POST /virtual``
(``serving.call_path.CallPath.answer``: same keys, records and counts).  Its result is one text
content holding the ``/virtual`` body, ``isError`` when the body's ``error`` is not empty.

**Sessions.**  An MCP session is a server session (:mod:`stabletoolbench_mirror.engine.sessions`):
over HTTP, the session an ``X-STM-Session`` header names, else one server session per
``Mcp-Session-Id`` (created at its first tool call); over stdio, one server session for the
process.  MCP's 2026 protocol era has no sessions: there a call is in a session only with
``X-STM-Session``.  A session's keys carry its history hash, which a frozen StableToolBench cache has
not: such a cache answers a session's call with the keys StableToolBench's client gives it
(``engine.lookup_order``), so the default answers from it; ``mcp.sessions: false`` keeps MCP calls
sessionless (``X-STM-Session`` still applies).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from cachetools import FIFOCache

from stabletoolbench_mirror.config import ConfigError, Settings
from stabletoolbench_mirror.core import fair, protocol
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.engine import sessions
from stabletoolbench_mirror.serving.admission import Admission, Refused
from stabletoolbench_mirror.serving.mcp_catalog import Catalog, QueryKey

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from starlette.types import Receive, Scope, Send

    from stabletoolbench_mirror.engine.layer import MirrorLayer
    from stabletoolbench_mirror.serving.call_path import CallPath
    from stabletoolbench_mirror.serving.mcp_live_front import LiveFront

log = logging.getLogger(__name__)

PREFIX = "/mcp"
QUERIES = "/mcp/queries/"
MCP_SESSION_HEADER = "mcp-session-id"
#: MCP sessions remembered with their server session (the oldest forgotten beyond it)
MAX_MCP_SESSIONS = 10_000
SESSION_IDLE_TIMEOUT_S = 1800.0  # an MCP session with no request for this long is closed (the SDK's own default)



def query_of(path: str) -> QueryKey | None | bool:
    """``None`` for ``/mcp``, ``(group, query_id)`` for ``/mcp/queries/<group>/<query_id>``, ``False`` for anything else."""
    if path.rstrip("/") == PREFIX:
        return None
    if path.startswith(QUERIES):
        group, _, query_id = path[len(QUERIES):].rstrip("/").partition("/")
        if group and query_id and "/" not in query_id:
            return group, query_id
    return False


async def _status_of(app: Any, scope: Scope, receive: Receive, send: Send) -> int | None:
    """Run ``app`` for one request; the HTTP status it answered (``None``: it sent none)."""
    status: list[int] = []

    async def watch(message: Any) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        await send(message)

    await app(scope, receive, watch)
    return status[0] if status else None


def tool_result(outcome: Outcome) -> Any:
    """The MCP result of a call: one text content holding the ``/virtual`` body, ``isError`` when its ``error`` is not empty."""
    import mcp_types as types

    try:
        body = json.loads(outcome.body)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else "not a /virtual answer"
    return types.CallToolResult(content=[types.TextContent(type="text", text=outcome.body)], is_error=bool(error))


def _no_such_tool(name: str) -> Any:
    import mcp_types as types

    # upstream's client answers an unknown function itself, with this observation; nothing is called or counted
    text = json.dumps(protocol.answer(f"No such function name: {name}", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class _SessionMap:
    """MCP session -> server session, created at an MCP session's first tool call."""

    def __init__(self) -> None:
        self._ids: FIFOCache[str, str] = FIFOCache(MAX_MCP_SESSIONS)  # the oldest forgotten first
        self._lock = anyio.Lock()

    async def server_session(self, layer: MirrorLayer, mcp_id: str) -> str | None | Outcome:
        if layer.sessions is None:
            return None
        known = self._ids.get(mcp_id)
        if known is not None:  # a session's every call but its first: no lock, no wait for the loop's next turn
            return known
        async with self._lock:
            found = self._ids.get(mcp_id)
            if found is None:
                try:
                    head = await anyio.to_thread.run_sync(layer.sessions.create, "")
                except Exception as exc:  # the store failed: the call is answered with the error, like /virtual's
                    return Outcome.error(503, f"stabletoolbench-mirror: cannot start a session: {exc}")
                found = head["id"]
                self._ids[mcp_id] = found
            return found


@dataclass
class _Open:
    """One open MCP session over HTTP: whose it is, when it was last used, its requests in flight."""

    client: str
    used: float
    busy: int = 0


class SessionBound:
    """Open MCP sessions bounded per client (``mcp.max_sessions_per_client``) and in all (``mcp.max_sessions``).

    The SDK's session manager keeps an initialized session for 30 minutes and refuses every new one
    once 10,000 are open, so one client sending ``initialize`` in a loop locked every other client out.
    Here a new session is let in only when it fits; else the least recently used *idle* session (no
    request in flight) of that client, or, when all are full, of the client that holds the most, is
    closed first (an MCP ``DELETE``, as a client closes its own), so another client always gets one.
    When none is idle the new one is refused with HTTP 503 naming the key.  Runs on the event loop.
    """

    def __init__(self, per_client: int, total: int) -> None:
        self.per_client = per_client
        self.total = total
        self._open: dict[str, _Open] = {}  # in the order of their last use
        self._count: dict[str, int] = {}  # per client: sessions open and being opened
        self._opening = 0

    def __len__(self) -> int:
        return len(self._open) + self._opening

    def held_by(self, client: str) -> int:
        return self._count.get(client, 0)

    def _expire(self, now: float) -> None:
        """Forget the sessions the SDK has closed for idleness (the same timeout, counted the same way)."""
        for sid in [sid for sid, s in self._open.items() if not s.busy and now - s.used > SESSION_IDLE_TIMEOUT_S]:
            self.closed(sid)

    def admit(self, client: str) -> tuple[list[str], str | None]:
        """Room for one more session of ``client``: the sessions to close first, or the key that refuses it."""
        self._expire(time.monotonic())
        victims: list[str] = []
        if self.held_by(client) >= self.per_client:
            victim = self._idle_of(client)
            if victim is None:
                return [], "mcp.max_sessions_per_client"
            victims.append(victim)
        elif len(self) >= self.total:
            victim = next((v for c in sorted(self._count, key=self._count.__getitem__, reverse=True)
                           if (v := self._idle_of(c)) is not None), None)
            if victim is None:
                return [], "mcp.max_sessions"
            victims.append(victim)
        for victim in victims:
            self.closed(victim)
        self._count[client] = self.held_by(client) + 1
        self._opening += 1
        return victims, None

    def _idle_of(self, client: str) -> str | None:
        return next((sid for sid, s in self._open.items() if s.client == client and not s.busy), None)

    def opened(self, client: str, sid: str | None) -> None:
        """The end of an ``admit``: ``sid`` the session it opened, ``None`` when none was."""
        self._opening -= 1
        if sid is None:
            self._drop(client)
        else:
            self._open[sid] = _Open(client, time.monotonic())

    def begin(self, sid: str, *, busy: bool = True) -> bool:
        """A request of session ``sid`` starts (``busy``: it keeps the session from being closed); ``False``: not one of these."""
        found = self._open.pop(sid, None)
        if found is None:
            return False
        found.busy += busy
        found.used = time.monotonic()
        self._open[sid] = found  # now the most recently used
        return True

    def end(self, sid: str, *, busy: bool = True) -> None:
        found = self._open.get(sid)
        if found is not None:
            found.busy -= busy
            found.used = time.monotonic()

    def closed(self, sid: str) -> None:
        found = self._open.pop(sid, None)
        if found is not None:
            self._drop(found.client)

    def _drop(self, client: str) -> None:
        left = self.held_by(client) - 1
        if left > 0:
            self._count[client] = left
        else:
            self._count.pop(client, None)


class _Asgi:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class McpFront:
    """The MCP server over the catalog, answering through a ``CallPath``."""

    def __init__(self, catalog: Catalog, settings: Settings) -> None:
        self.catalog = catalog
        self.settings = settings
        self._manager: Any = None
        self._admission: Admission | None = None
        self._sessions = _SessionMap()
        self._layer: MirrorLayer | None = None
        self.endpoint: Any = None
        """``/mcp``'s ASGI app, once mounted (the server's pure-ASGI front hands it ``/mcp`` requests directly)."""
        self.live: LiveFront | None = None
        """The live MCP servers' tools (``mcp_servers``), offered at ``/mcp`` instead of StableToolBench's."""
        mcp = settings.mcp
        self.bound = SessionBound(mcp.max_sessions_per_client, mcp.max_sessions)

    @classmethod
    def from_settings(cls, settings: Settings) -> McpFront:
        try:
            import mcp.server.lowlevel  # noqa: F401
        except ImportError:
            raise ConfigError("mcp.enabled: the MCP front needs the official MCP SDK: pip install 'stabletoolbench-mirror[mcp]', "
                              "or set mcp.enabled: false") from None
        return cls(Catalog.from_settings(settings), settings)

    # -- the MCP server --------------------------------------------------------------------------

    def server(self, path: CallPath, *, query: QueryKey | None = None, session: str | None = None) -> Server[Any]:
        """The SDK's server: for HTTP the scope comes from each request's path, for stdio it is ``query`` and ``session``."""
        from mcp.server.lowlevel import Server

        async def list_tools(ctx: Any, params: Any) -> Any:
            cursor = params.cursor if params is not None else None
            where = self._scope_of(ctx, query)
            if self.live is not None and where is None:
                return self.live.page(cursor)
            return self.catalog.page(where, cursor)

        async def call_tool(ctx: Any, params: Any) -> Any:
            where = self._scope_of(ctx, query)
            scope = self.catalog.scope(where) or {}
            fn = scope.get(params.name)
            live = self.live is not None and where is None and self.live.offers(params.name)
            if fn is None and not live:
                return _no_such_tool(params.name)
            arguments = params.arguments or {}
            if ctx.request is None:  # stdio: one client
                if live:
                    assert self.live is not None
                    return await self.live.call(params.name, arguments, session)
                assert fn is not None
                return tool_result(await path.answer(fn.target.payload(arguments), session))
            client = ctx.request.client.host if ctx.request.client else "?"
            fair.CLIENT.set(client)  # the worker threads are shared fairly between clients, as /virtual's
            admission = self._admission
            if admission is not None:
                try:
                    await admission.enter(client)  # a slot among the client's in-flight calls, as /virtual's
                except Refused as refusal:
                    return tool_result(self._refused(path, refusal))
            try:
                call_session = await self._session_of(ctx, path.layer)
                if live and self.live is not None:
                    if isinstance(call_session, Outcome):
                        return tool_result(call_session)
                    return await self.live.call(params.name, arguments, call_session, sessions.HEADER not in ctx.request.headers)
                assert fn is not None
                return tool_result(await path.answer(fn.target.payload(arguments), call_session))
            finally:
                if admission is not None:
                    admission.leave(client)

        from stabletoolbench_mirror import __version__

        return Server("stabletoolbench-mirror", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)

    @staticmethod
    def _refused(path: CallPath, refusal: Refused) -> Outcome:
        """The counted answer to a call over a limit (as ``/virtual``'s HTTP 503)."""
        outcome = Outcome.error(503, refusal.message, OutcomeKind.REFUSED, refusal.limit)
        path.layer.stats.count(outcome)
        return outcome

    @staticmethod
    def _scope_of(ctx: Any, fixed: QueryKey | None) -> QueryKey | None:
        if ctx.request is None:
            return fixed
        found = query_of(ctx.request.url.path)
        return None if found is False else found  # type: ignore[return-value]

    async def _session_of(self, ctx: Any, layer: MirrorLayer) -> str | None | Outcome:
        headers = ctx.request.headers
        given = headers.get(sessions.HEADER)
        if given is not None:
            problem = sessions.id_problem(given)
            return Outcome.error(422, f"{sessions.HEADER}: {problem}") if problem else given
        mcp_id = headers.get(MCP_SESSION_HEADER)
        if mcp_id is None or not self.settings.mcp.sessions:
            return None
        return await self._sessions.server_session(layer, mcp_id)

    # -- HTTP ----------------------------------------------------------------------------------

    def mount(self, app: Any, path: CallPath, admission: Admission | None = None) -> None:
        """Add ``/mcp`` and ``/mcp/queries/<group>/<query_id>`` to ``app`` (run :meth:`running` in its lifespan).

        ``admission``: ``/virtual``'s, so a client's MCP calls take slots among its in-flight requests too.
        """
        self._admission = admission
        self._layer = path.layer
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from starlette.routing import Route

        mcp = self.settings.mcp
        self._manager = StreamableHTTPSessionManager(
            app=self.server(path), max_request_body_size=self.settings.limits.max_body_bytes,
            session_idle_timeout=SESSION_IDLE_TIMEOUT_S, max_sessions=mcp.max_sessions + 64,  # SessionBound bounds them first
        )
        endpoint = self.endpoint = _Asgi(self._http)  # an ASGI app, not a function: Starlette hands it the raw request
        app.router.routes.append(Route(PREFIX, endpoint=endpoint, include_in_schema=False))
        app.router.routes.append(Route(PREFIX + "/{rest:path}", endpoint=endpoint, include_in_schema=False))

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = query_of(scope["path"])
        if query is False or (query is not None and query not in self.catalog.queries):
            await self._no_endpoint(scope, receive, send)
            return
        sid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"mcp-session-id"), None)
        if sid is None and scope["method"] == "POST":
            await self._open_session(scope, receive, send)
        elif sid is not None and self.bound.begin(sid, busy=scope["method"] != "GET"):  # a GET stream only listens
            status = None
            try:
                status = await self._in_session(scope, receive, send, sid, direct=self.live is not None and query is None)
            finally:
                self.bound.end(sid, busy=scope["method"] != "GET")
                if status == 404 or (scope["method"] == "DELETE" and status is not None and status < 400):
                    self.bound.closed(sid)
        else:
            await self._manager.handle_request(scope, receive, send)

    async def _no_endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.responses import JSONResponse

        served = "the queries of mcp.queries" if self.catalog.queries else "no queries (mcp.queries is empty)"
        message = f"no MCP endpoint {scope['path']}: /mcp serves the tools, /mcp/queries/<group>/<query_id> one query's ({served})"
        await JSONResponse(protocol.answer(message, ""), status_code=404)(scope, receive, send)

    async def _in_session(self, scope: Scope, receive: Receive, send: Send, sid: str, direct: bool) -> int | None:
        """A request of an open session: a live tool's call answered directly (``direct``), else by the SDK; its status."""
        status = None
        if direct and scope["method"] == "POST":
            from stabletoolbench_mirror.serving.mcp_live_front import answer_directly

            assert self.live is not None
            receive, status = await answer_directly(self.live, scope, receive, send, sid, self._admission,
                                                    self._live_session, self.settings.limits.max_body_bytes)
        if status is None:
            status = await _status_of(self._manager.handle_request, scope, receive, send)
        return status

    async def _live_session(self, headers: Any, sid: str) -> tuple[str | None | Outcome, bool]:
        """A direct live call's server session (:func:`.mcp_live_front.answer_directly`), as :meth:`_session_of` finds
        one, and whether it is this process's own (an MCP session's, not one ``X-STM-Session`` names)."""
        given = headers.get(sessions.HEADER)
        if given is not None:
            problem = sessions.id_problem(given)
            return (Outcome.error(422, f"{sessions.HEADER}: {problem}") if problem else given), False
        if not self.settings.mcp.sessions or self._layer is None:
            return None, True
        return await self._sessions.server_session(self._layer, sid), True

    async def _open_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request that may open a session (an ``initialize``): only once :class:`SessionBound` has room for it."""
        client = scope["client"][0] if scope.get("client") else "?"
        victims, refused = self.bound.admit(client)
        if refused is not None:
            from starlette.responses import JSONResponse

            held = self.bound.held_by(client) if refused.endswith("per_client") else len(self.bound)
            message = (f"stabletoolbench-mirror: too many open MCP sessions ({held}, none idle); the server's {refused} "
                       "setting bounds this (or close sessions you no longer use: an MCP DELETE)")
            await JSONResponse(protocol.answer(message, ""), status_code=503, headers={"retry-after": "1"})(scope, receive, send)
            return
        for victim in victims:
            await self._close(victim)
        opened: list[str] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400 and not opened:
                opened.extend(v.decode("latin-1") for k, v in message.get("headers", ()) if k.lower() == b"mcp-session-id")
                if opened:
                    # counted before the client can read its id: a request it sends at once is that session's (busy)
                    self.bound.opened(client, opened[0])
            await send(message)

        try:
            await self._manager.handle_request(scope, receive, watch)
        finally:
            if not opened:
                self.bound.opened(client, None)

    async def _close(self, sid: str) -> None:
        """Close a session as its client would: an MCP ``DELETE`` with its id, answered to nobody."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "DELETE", "scheme": "http",
                 "path": PREFIX, "raw_path": PREFIX.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"mcp-session-id", sid.encode("latin-1")), (b"host", b"127.0.0.1")], "client": None, "server": None}

        async def receive() -> Any:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            pass

        try:
            await self._manager.handle_request(scope, receive, send)
        except Exception:  # noqa: BLE001 - a session that ended meanwhile is closed all the same
            log.debug("closing MCP session %s failed", sid[:64], exc_info=True)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The HTTP session manager's task group, for the app's lifespan."""
        async with self._manager.run():
            yield

    # -- stdio ---------------------------------------------------------------------------------

    async def serve_stdio(self, path: CallPath, query: QueryKey | None = None) -> None:
        """Serve MCP on this process's stdin and stdout until the client closes them (one server session)."""
        from mcp.server.stdio import stdio_server

        session = None
        if path.layer.sessions is not None and self.settings.mcp.sessions:
            head = await anyio.to_thread.run_sync(path.layer.sessions.create, "")
            session = head["id"]
        server = self.server(path, query=query, session=session)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
