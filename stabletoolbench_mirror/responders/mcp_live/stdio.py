"""A live MCP server over stdio with its output bounded: the SDK client's :class:`~mcp.client.Client` transport
(the process, its stdin and its stdout as the client's two streams), each line of stdout at most
:data:`MAX_LINE_BYTES`.

Why not the SDK's ``stdio_client``: it joins each chunk of stdout to the line read so far with no bound, so one
endless line (a hostile server's, or a tool result of gigabytes) is held whole in the mirror's memory, copied
once per 64 KiB chunk on the way.  Here stdout is read as bytes; a line that grows past the bound is dropped as
it streams in (never held), and in its place the client gets a JSON-RPC error for the request it answered (its
``id`` read from the line's first bytes, where a server writes it) naming the bound; a line whose ``id`` cannot
be read is dropped with a warning, and its call waits out ``call_timeout_s``.  Every other line is parsed as the
SDK parses one.  The process is started in a session of its own and stopped with its descendants (the SDK's
``terminate_posix_process_tree``); its stderr is the mirror's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

log = logging.getLogger(__name__)

#: the longest line of a server's stdout read (one JSON-RPC message): the largest result kept, and room for its frame
MAX_LINE_BYTES = (16 << 20) + (1 << 20)
#: the first bytes of a line too long, searched for its ``id``
HEAD_BYTES = 256
#: how long a server has to exit once its stdin is closed, before it (and its descendants) are terminated
EXIT_WAIT_S = 2.0
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')


def _too_long(head: bytes, limit: int) -> SessionMessage | None:
    """The JSON-RPC error the client gets for a line over ``limit`` bytes: for the request whose ``id`` ``head`` names."""
    found = _ID.search(head)
    if found is None:
        return None
    raw = found.group(1)
    request_id: int | str = int(raw) if raw[:1] != b'"' else raw[1:-1].decode("utf-8", "replace")
    message = f"the server's answer is over {limit} bytes: left out as it streamed (this mirror reads lines of at most {limit})"
    error = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=-32603, message=message))
    return SessionMessage(error)


def _parsed(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        log.warning("a live MCP server wrote a line that is not JSON-RPC (%d bytes): %s", len(line), str(exc).splitlines()[0][:200])
        return exc


class _Lines:
    """Stdout's bytes as lines of at most ``limit`` bytes (see the module)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.line = bytearray()
        self.dropping = False
        self.head = b""

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        out: list[SessionMessage | Exception] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not self.dropping and len(self.line) + len(piece) > self.limit:
                self.dropping, self.head = True, (bytes(self.line[:HEAD_BYTES]) + piece[:HEAD_BYTES])[:HEAD_BYTES]
                self.line = bytearray()
            elif not self.dropping:
                self.line += piece
            if end < 0:
                return out
            out += self._ended()
            start = end + 1

    def _ended(self) -> list[SessionMessage | Exception]:
        line, self.line = bytes(self.line), bytearray()
        if self.dropping:
            self.dropping = False
            error = _too_long(self.head, self.limit)
            if error is None:
                log.warning("a live MCP server wrote a line over %d bytes with no id to answer: left out", self.limit)
                return []
            return [error]
        return [_parsed(line)] if line.strip() else []


@asynccontextmanager
async def bounded_stdio(params: StdioServerParameters, limit: int = MAX_LINE_BYTES) -> AsyncIterator[tuple[Any, Any]]:
    """The transport of ``params``' server: ``(read_stream, write_stream)`` while the process runs."""
    env = {**get_default_environment(), **(params.env or {})}
    process = await anyio.open_process([params.command, *params.args], env=env, cwd=params.cwd, stderr=None,
                                       start_new_session=True)  # a command that cannot start raises here: nothing to close
    to_client, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_client = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        assert process.stdout is not None
        lines = _Lines(limit)
        async with to_client:
            try:
                async for chunk in process.stdout:
                    for message in lines.feed(chunk):
                        await to_client.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass

    async def write() -> None:
        assert process.stdin is not None
        async with from_client:
            try:
                async for message in from_client:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode("utf-8"))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            tasks.start_soon(write)
            try:
                yield read_stream, write_stream
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(process)
        await read_stream.aclose()
        await write_stream.aclose()


async def _stop(process: Process) -> None:
    """Close the server's stdin, let it exit for :data:`EXIT_WAIT_S`, then terminate it and its descendants."""
    if process.stdin is not None:
        try:
            await process.stdin.aclose()
        except (OSError, anyio.BrokenResourceError):
            pass
    with anyio.move_on_after(EXIT_WAIT_S):
        await process.wait()
    if process.returncode is None:
        try:
            await terminate_posix_process_tree(process, EXIT_WAIT_S)
        except (OSError, ProcessLookupError):
            pass
