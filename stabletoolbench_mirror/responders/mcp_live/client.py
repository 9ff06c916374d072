"""One live MCP server, reached with the official SDK's client (``mcp.Client``): started, listed, called, stopped.

The SDK's client is asynchronous and holds its transport (a server process over stdio, or a streamable
HTTP connection) inside one task; each :class:`LiveServer` runs that task in an event loop of its own, in a
thread of its own, so a server that hangs, floods or dies never holds the mirror's event loop.  The mirror's
worker threads hand it a coroutine (``asyncio.run_coroutine_threadsafe``) and wait for it with a deadline.

A live server's output is hostile: every wait is bounded (``start_timeout_s``, ``call_timeout_s``), a stdio
server's lines are read at most :data:`~.stdio.MAX_LINE_BYTES` long (:mod:`.stdio`), a tool result over
:data:`MAX_RESULT_BYTES` is refused, a listing keeps at most :data:`MAX_TOOLS` tools of at
most :data:`MAX_LISTING_BYTES`.  A server that cannot be reached is :class:`LiveServerDown`, whose message
names the server; it is started again at the next call after :data:`RESTART_AFTER_S`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from stabletoolbench_mirror.config import McpServerConfig

log = logging.getLogger(__name__)

#: the largest tool result kept (its JSON): a larger one is the server's failure, never recorded
MAX_RESULT_BYTES = 16 << 20
#: the most tools one server's listing keeps (the rest are left out, with a warning)
MAX_TOOLS = 20_000
#: the most bytes of tools one server's listing keeps (their JSON)
MAX_LISTING_BYTES = 32 << 20
#: a server that could not be started is not started again for this long
RESTART_AFTER_S = 10.0
#: ``${VAR}`` in an ``env`` or ``headers`` value
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class LiveServerDown(Exception):
    """The server could not be started or reached, or its answer cannot be kept; the message names it."""


def expand(value: str, where: str) -> str:
    """``value`` with each ``${VAR}`` replaced from this process's environment (never stored)."""

    def one(match: re.Match[str]) -> str:
        found = os.environ.get(match.group(1))
        if found is None:
            raise LiveServerDown(f"{where}: the environment variable {match.group(1)} is not set")
        return found

    return _REFERENCE.sub(one, value)


class LiveServer:
    """One configured server and its connection (see the module's docstring); its methods are for worker threads."""

    def __init__(self, name: str, config: McpServerConfig) -> None:
        self.name = name
        self.config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed_at = 0.0
        self._failure = ""

    # -- the connection -----------------------------------------------------------------------

    def _transport(self) -> Any:
        where = f"mcp_servers.{self.name}"
        cfg = self.config
        if cfg.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = {k: expand(v, f"{where}.headers.{k}") for k, v in cfg.headers.items()}
            http = httpx2.AsyncClient(headers=headers, timeout=cfg.call_timeout_s)
            return streamable_http_client(cfg.url, http_client=http)
        from mcp.client.stdio import StdioServerParameters

        from stabletoolbench_mirror.responders.mcp_live.stdio import bounded_stdio

        env = {k: expand(v, f"{where}.env.{k}") for k, v in cfg.env.items()}
        assert cfg.command is not None
        return bounded_stdio(StdioServerParameters(command=cfg.command, args=list(cfg.args), env=env or None, cwd=cfg.cwd))

    async def _run(self, ready: Future[None]) -> None:
        from mcp import Client

        self._stop = asyncio.Event()
        try:
            async with Client(self._transport(), read_timeout_seconds=self.config.call_timeout_s) as client:
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - whatever ended the connection is the server's failure
            if not ready.done():
                ready.set_exception(LiveServerDown(f"MCP server {self.name!r} did not start: {_why(exc)}"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %r: the connection ended: %s", self.name, _why(exc))
        finally:
            self._client = None

    def _thread_main(self, ready: Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._run(ready))
        finally:
            loop.close()

    def start(self) -> None:
        """Connect (start the process) within ``start_timeout_s``; :class:`LiveServerDown` naming the server when it cannot."""
        with self._lock:
            if self._client is not None:
                return
            if self._failure and time.monotonic() - self._failed_at < RESTART_AFTER_S:
                raise LiveServerDown(self._failure)
            self._stop_thread()
            ready: Future[None] = Future()
            self._thread = threading.Thread(target=self._thread_main, args=(ready,), name=f"mcp-{self.name}", daemon=True)
            self._thread.start()
            try:
                ready.result(self.config.start_timeout_s)
                self._failure = ""
            except FutureTimeout:
                self._fail(f"MCP server {self.name!r} did not start within {self.config.start_timeout_s:g} s "
                           f"(mcp_servers.{self.name}.start_timeout_s)")
            except LiveServerDown as exc:
                self._fail(str(exc))

    def _fail(self, message: str) -> None:
        self._failure, self._failed_at = message, time.monotonic()
        self._stop_thread()
        raise LiveServerDown(message)

    def _stop_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            def stop() -> None:
                if self._stop is not None:
                    self._stop.set()
                for task in asyncio.all_tasks(loop):  # a start that hangs: cancelled, the SDK stops the process
                    task.cancel()

            try:
                loop.call_soon_threadsafe(stop)
            except RuntimeError:  # the loop closed meanwhile
                pass
            thread.join(15)
        self._loop = self._thread = None

    def _ask(self, make: Any, timeout_s: float) -> Any:
        """Run ``make(client)`` on the connection's loop; its result within ``timeout_s``."""
        self.start()
        loop, client = self._loop, self._client
        if loop is None or client is None:
            raise LiveServerDown(f"MCP server {self.name!r} is not connected")
        future = asyncio.run_coroutine_threadsafe(make(client), loop)
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()
            raise LiveServerDown(f"MCP server {self.name!r} did not answer within {timeout_s:g} s "
                                 f"(mcp_servers.{self.name}.call_timeout_s)") from None
        except LiveServerDown:
            raise
        except Exception as exc:  # noqa: BLE001 - the SDK's errors (connection closed, protocol errors)
            with self._lock:
                if self._client is None or "closed" in str(exc).lower():
                    self._failure, self._failed_at = f"MCP server {self.name!r} is down: {_why(exc)}", time.monotonic()
            raise LiveServerDown(f"MCP server {self.name!r} failed: {_why(exc)}") from None

    # -- what is asked ------------------------------------------------------------------------

    def list_tools(self) -> list[dict[str, Any]]:
        """Every tool the server lists (page by page), as JSON; at most :data:`MAX_TOOLS` of :data:`MAX_LISTING_BYTES`."""

        async def listing(client: Any) -> list[dict[str, Any]]:
            tools: list[dict[str, Any]] = []
            size, cursor = 0, None
            while True:
                page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                for tool in page.tools:
                    data = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
                    size += len(str(data))
                    if len(tools) >= MAX_TOOLS or size > MAX_LISTING_BYTES:
                        log.warning("MCP server %r lists more than %d tools or %d bytes: the rest are left out",
                                    self.name, MAX_TOOLS, MAX_LISTING_BYTES)
                        return tools
                    tools.append(data)
                cursor = page.next_cursor
                if not cursor:
                    return tools

        return list(self._ask(listing, self.config.start_timeout_s))

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The server's ``CallToolResult`` as JSON; :class:`LiveServerDown` when it gives none that can be kept."""

        async def calling(client: Any) -> dict[str, Any]:
            result = await client.call_tool(tool, arguments)
            text = result.model_dump_json(by_alias=True, exclude_none=True)
            if len(text) > MAX_RESULT_BYTES:
                raise LiveServerDown(f"MCP server {self.name!r}: the result of {tool[:80]!r} is {len(text)} bytes, "
                                     f"over the {MAX_RESULT_BYTES} this mirror keeps")
            data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            return data

        return dict(self._ask(calling, self.config.call_timeout_s))

    def close(self) -> None:
        """Stop the connection (the SDK stops the server process: stdin closed, then terminated)."""
        with self._lock:
            self._stop_thread()


def _why(exc: BaseException) -> str:
    """A short reason of an error (an exception group's first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text[:300]
