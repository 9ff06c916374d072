"""Real third-party MCP servers for the live-MCP tests, started as their users start them.

The PyPI servers ``mcp-server-time`` and ``mcp-server-git`` install beside this project (the ``test`` extra) and
run from its venv; ``mcp-server-sqlite`` needs the MCP SDK 1.x, which cannot live beside this project's 2.x, so it
is installed in a venv of its own (``STM_CI_MCP_SQLITE_VENV``, default ``.mcp-sqlite`` in the repository; ``.ci/run``
makes it).  The npm servers
(``@modelcontextprotocol/server-everything``, ``server-filesystem``, ``server-memory``) are read from
``STM_CI_MCP_NODE_DIR`` (default ``.mcp-node``; ``.ci/run`` installs them there) and run with ``node``.  An agent
framework's client, FastMCP's, runs from a venv of its own too (``STM_CI_MCP_CLIENT_VENV``, default ``.mcp-client``).
A test that needs one that is not installed skips, naming what installs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO

SQLITE_VENV = Path(os.environ.get("STM_CI_MCP_SQLITE_VENV", REPO / ".mcp-sqlite"))
NODE_DIR = Path(os.environ.get("STM_CI_MCP_NODE_DIR", REPO / ".mcp-node"))
CLIENT_VENV = Path(os.environ.get("STM_CI_MCP_CLIENT_VENV", REPO / ".mcp-client"))
NPM_PACKAGES = {"everything": "server-everything", "filesystem": "server-filesystem", "memory": "server-memory"}


def python_server(bin_dir: Path, script: str, install: str, *args: str) -> dict[str, Any]:
    """The ``mcpServers`` entry of a PyPI server's console script; skips when it is not installed."""
    path = bin_dir / script
    if not path.exists():
        pytest.skip(f"{script} is not installed: {install}")
    return {"command": str(path), "args": list(args)}


def time_server() -> dict[str, Any]:
    return python_server(Path(sys.executable).parent, "mcp-server-time", "pip install -e '.[test]'", "--local-timezone", "UTC")


def git_server(repo: Path) -> dict[str, Any]:
    return python_server(Path(sys.executable).parent, "mcp-server-git", "pip install -e '.[test]'", "--repository", str(repo))


def sqlite_server(db: Path) -> dict[str, Any]:
    install = f"python3 -m venv {SQLITE_VENV} && {SQLITE_VENV}/bin/pip install mcp-server-sqlite 'mcp<2'"
    return python_server(SQLITE_VENV / "bin", "mcp-server-sqlite", install, "--db-path", str(db))


def node_server(kind: str, *args: str) -> dict[str, Any]:
    """The ``mcpServers`` entry of an npm server, run with node; skips without node or the package."""
    package = NODE_DIR / "node_modules" / "@modelcontextprotocol" / NPM_PACKAGES[kind]
    node = shutil.which("node")
    if node is None or not package.is_dir():
        pytest.skip(f"node or @modelcontextprotocol/{NPM_PACKAGES[kind]} is missing: npm install --prefix {NODE_DIR} "
                    f"@modelcontextprotocol/{NPM_PACKAGES[kind]}")
    return {"command": node, "args": [str(package / "dist" / "index.js"), *args]}


def make_git_repo(folder: Path) -> Path:
    """A git repository with one commit, for ``mcp-server-git``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(folder)], check=True, env=env)
    (folder / "README.md").write_text("hello\n")
    subprocess.run(["git", "-C", str(folder), "add", "README.md"], check=True, env=env)
    subprocess.run(["git", "-C", str(folder), "commit", "-q", "-m", "first"], check=True, env=env)
    return folder


def children_running(command_part: str) -> list[str]:
    """The command lines of this process's descendants that contain ``command_part`` (a live server still running)."""
    found = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True, check=True).stdout.splitlines()[1:]
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for line in found:
        pid, ppid, args = line.split(None, 2) if len(line.split(None, 2)) == 3 else (*line.split(None, 1), "")
        parents[int(pid)], lines[int(pid)] = int(ppid), args
    mine = []
    for pid, args in lines.items():
        up = pid
        while up in parents and up != os.getpid() and up > 1:
            up = parents[up]
        if up == os.getpid() and pid != os.getpid() and command_part in args:
            mine.append(args)
    return mine


async def session(url: Any, calls: list[tuple[str, dict[str, Any]]], headers: dict[str, str] | None = None,
                  mode: str = "auto") -> tuple[list[Any], list[Any]]:
    """An agent-like SDK client session at ``url`` (or a stdio server's ``StdioServerParameters``): every tool listed
    (page by page), then ``calls`` in order.

    ``mode``: the SDK's protocol era, ``auto`` (the 2026 era: no MCP session) or ``legacy`` (the handshake: a session)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    transport = (streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers or {}, timeout=120))
                 if isinstance(url, str) else url)
    async with Client(transport, mode=mode) as client:
        page = await client.list_tools()
        tools = list(page.tools)
        while page.next_cursor is not None:
            page = await client.list_tools(cursor=page.next_cursor)
            tools += page.tools
        results = [await client.call_tool(name, arguments) for name, arguments in calls]
    return tools, results


def run_session(url: Any, calls: list[tuple[str, dict[str, Any]]], **kwargs: Any) -> tuple[list[Any], list[Any]]:
    return asyncio.run(session(url, calls, **kwargs))


def fastmcp_session(url: str, calls: list[tuple[str, dict[str, Any]]], work: Path) -> dict[str, Any]:
    """An agent framework's client session at ``url`` (FastMCP's ``Client``, in its venv: :data:`CLIENT_VENV`): the tools
    it listed and the results it got, as ``tests/helpers/fastmcp_agent.py`` prints them; skips when it is not installed."""
    python = CLIENT_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"FastMCP is not installed: python3 -m venv {CLIENT_VENV} && {CLIENT_VENV}/bin/pip install fastmcp")
    path = work / "fastmcp-calls.json"
    path.write_text(json.dumps(calls), encoding="utf-8")
    done = subprocess.run([str(python), str(REPO / "tests" / "helpers" / "fastmcp_agent.py"), url, str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
