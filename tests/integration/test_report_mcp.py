"""``report`` of a live-MCP run: its servers, their tools, calls by source and drift (the ``mcp`` part).

A diskcache store is written with the records a live-MCP run leaves (real :class:`Record`\\ s, named by
``responders.mcp_live.tools``): two servers, ``time`` and ``evil``, each with its ``tools/list``, calls answered
by the server (``mcp``), by the simulator and failed, and drift records (``mcp-verify``'s, one drifted then one
unchanged, and a record run's); ``evil`` lists a tool named ``<script>alert(1)</script>``.  Then ``report`` on
the store (``--json`` and ``--html``, as subprocesses) and on a snapshot of it, the figures worked out by hand.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.responders.mcp_live import tools
from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore
from tests.helpers.paths import REPO

EVIL = "<script>alert(1)</script>"
LISTED_TIME, LISTED_EVIL = 1790000000.25, 1790000600.5
VERIFY_DRIFTED, RECORD_SEEN, VERIFY_UNCHANGED = 1790001200.75, 1790001800.0, 1790002400.0
ISO = {LISTED_TIME: "2026-09-21T14:13:20Z", LISTED_EVIL: "2026-09-21T14:23:20Z", VERIFY_DRIFTED: "2026-09-21T14:33:20Z",
       RECORD_SEEN: "2026-09-21T14:43:20Z", VERIFY_UNCHANGED: "2026-09-21T14:53:20Z"}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def calls(server: str, tool: str, source: str, n: int, start: int = 0) -> list[Record]:
    """``n`` recorded calls of ``tool`` (each its own arguments), answered by ``source`` (``mcp``, ``simulated``, ``failure``)."""
    out = []
    for i in range(start, start + n):
        arguments = {"i": i}
        key = tools.call_key(tools.call_digest(tool, arguments, []), 1)
        meta = {"tool": tool, "arguments": arguments, "run": "r1", "listed_at": LISTED_TIME, "latency_s": 0.01}
        api = tools.tool_api(server, tool)
        if source == "failure":
            record = Record.failure(api, key, result("down"), "mcp", f"mcp:{server}", reason=f"MCP server {server!r} is down")
            out.append(dataclasses.replace(record, meta=meta))
        elif source == "simulated":
            out.append(Record.from_answer(api, key, result(f"sim {i}"), "simulated", "sim-model", meta={**meta, "server_down": "gone"}))
        else:
            out.append(Record.from_answer(api, key, result(f"{tool} {i}"), "mcp", f"mcp:{server}", meta=meta))
    return out


def listing(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "description": f"the {n} tool", "inputSchema": {"type": "object"}} for n in names]


def drift(server: str, schema: dict[str, list[str]], answers: dict[str, list[str]], error: str | None = None) -> dict[str, Any]:
    return {"server": server, "drifted": bool(schema or answers or error), "schema": schema, "answers": answers,
            "calls": 10, "differing": len(answers), "error": error}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp-report") / "store"
    records = [
        *calls("time", "get_time", "mcp", 5), *calls("time", "get_time", "simulated", 1, 5), *calls("time", "convert_time", "mcp", 4),
        *calls("evil", EVIL, "mcp", 2), *calls("evil", "echo", "mcp", 1), *calls("evil", "echo", "simulated", 1, 1),
        *calls("evil", "echo", "failure", 2, 2),
        tools.listing_record("time", listing("get_time", "convert_time"), LISTED_TIME),
        tools.listing_record("evil", listing(EVIL, "echo", "unused"), LISTED_EVIL),
        # the drift records, out of time order: the report orders them
        tools.drift_record("time", drift("time", {}, {}), "verify", VERIFY_UNCHANGED),
        tools.drift_record("time", drift("time", {"convert_time": ["inputSchema.properties.tz"]}, {"get_time": ["content.0.text"]}),
                           "verify", VERIFY_DRIFTED),
        tools.drift_record("evil", drift("evil", {EVIL: ["description"], "new_one": ["added"]}, {}), "record", RECORD_SEEN),
        # one ordinary tool answer beside them
        Record.from_answer("Data/weather_for_Data/today", "k1", {"error": "", "response": "sunny"}, "simulated", "sim-model"),
    ]
    db = DiskcacheStore(path)
    try:
        for record in records:
            db.add(record, None)
    finally:
        db.close()
    return path


@pytest.fixture(scope="module")
def snapshot(store: Path) -> Path:
    out = store.parent / "snapshot"
    made = cli("snapshot", str(out), "--store-path", str(store), "-q", cwd=store.parent)
    assert made.returncode == 0, made.stdout + made.stderr
    return out


def report(source: list[str], cwd: Path) -> tuple[dict[str, Any], list[str]]:
    ran = cli("report", *source, "--json", "-q", cwd=cwd)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return json.loads(ran.stdout), ran.stderr.splitlines()


TIME_DRIFT = [
    {"seen": "verify", "at": ISO[VERIFY_DRIFTED], "drifted": True, "schema": {"convert_time": ["inputSchema.properties.tz"]},
     "answers": {"get_time": ["content.0.text"]}, "calls": 10, "differing": 1, "error": None},
    {"seen": "verify", "at": ISO[VERIFY_UNCHANGED], "drifted": False, "schema": {}, "answers": {}, "calls": 10, "differing": 0,
     "error": None},
]
EVIL_DRIFT = [{"seen": "record", "at": ISO[RECORD_SEEN], "drifted": True, "schema": {EVIL: ["description"], "new_one": ["added"]},
               "answers": {}, "calls": 10, "differing": 0, "error": None}]


def test_the_store_report_has_each_server_its_tools_calls_by_source_and_drift(store: Path) -> None:
    got, lines = report(["--store-path", str(store)], store.parent)
    assert got["mcp"] == {
        "servers": {
            "evil": {"tools_listed": 3, "listed_at": ISO[LISTED_EVIL], "tools_called": 2, "calls": 6,
                     "calls_by_source": {"mcp": 3, "simulated": 1, "failure": 2}, "calls_by_tool": {"echo": 4, EVIL: 2},
                     "drift": EVIL_DRIFT, "last_verified": None, "drifted": True},
            "time": {"tools_listed": 2, "listed_at": ISO[LISTED_TIME], "tools_called": 2, "calls": 10,
                     "calls_by_source": {"mcp": 9, "simulated": 1, "failure": 0}, "calls_by_tool": {"get_time": 6, "convert_time": 4},
                     "drift": TIME_DRIFT, "last_verified": {"at": ISO[VERIFY_UNCHANGED], "drifted": False}, "drifted": False},
        },
        "drifted": True,
    }
    assert (f"mcp server time: 2 tools listed ({ISO[LISTED_TIME]}), 2 called, 10 calls (mcp 9, simulated 1), "
            f"last verified {ISO[VERIFY_UNCHANGED]}: unchanged") in lines
    assert (f"mcp server evil: 3 tools listed ({ISO[LISTED_EVIL]}), 2 called, 6 calls (mcp 3, simulated 1, failure 2), "
            "never verified") in lines
    assert f"  drifted (record {ISO[RECORD_SEEN]}): {EVIL} schema: description" in lines
    assert f"  drifted (record {ISO[RECORD_SEEN]}): new_one schema: added" in lines
    assert not any("convert_time schema" in line for line in lines), "time's latest drift record is unchanged"


def test_listing_and_drift_records_are_no_tool_answers(store: Path) -> None:
    got, _ = report(["--store-path", str(store)], store.parent)
    records = got["records"]
    assert records["entries"] == 17  # 16 MCP calls and the weather answer: no listing (2) nor drift record (3)
    assert records["by_source"] == {"mcp": 14, "simulated": 3}
    assert records["failures"] == 2
    assert records["by_category"]["@mcp"] == {"failure": 2, "mcp": 12, "simulated": 2, "total": 16}
    assert not any(tool.endswith(("@tools", "@drift")) for tool in records["by_tool"])
    assert sum(row["total"] for row in records["by_tool"].values()) == 17


def test_the_snapshot_report_has_the_same_servers_tools_calls_and_drift(store: Path, snapshot: Path) -> None:
    of_store, _ = report(["--store-path", str(store)], store.parent)
    got, lines = report([str(snapshot)], store.parent)
    assert got["source"]["kind"] == "snapshot"
    assert got["mcp"]["drifted"] is True
    # the manifest lists the simulated MCP entries (a tree keeps no provenance): the same calls by source as the store's
    assert got["mcp"]["servers"] == of_store["mcp"]["servers"]
    assert got["records"]["entries"] == 17
    assert got["records"]["by_source"] == {"mcp": 14, "simulated": 3}  # the manifest's, less the 5 listing and drift records
    assert got["records"]["by_category"]["@mcp"] == {"answer": 14, "failure": 2, "total": 16}
    assert (f"mcp server evil: 3 tools listed ({ISO[LISTED_EVIL]}), 2 called, 6 calls (mcp 3, simulated 1, failure 2), "
            "never verified") in lines


class Tables(HTMLParser):
    """The text of every cell of the page's tables, by table id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def page_of(source: list[str], where: Path, name: str) -> tuple[str, dict[str, list[list[str]]]]:
    out = where / f"{name}.html"
    ran = cli("report", *source, "--html", str(out), "-q", cwd=where)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    text = out.read_text(encoding="utf-8")
    parser = Tables()
    parser.feed(text)
    return text, parser.tables


def test_the_page_shows_the_servers_and_drift_every_name_escaped(store: Path, snapshot: Path, tmp_path: Path) -> None:
    for source, name in ((["--store-path", str(store)], "store"), ([str(snapshot)], "snapshot")):
        text, tables = page_of(source, tmp_path, name)
        assert "<h2>Live MCP servers</h2>" in text
        assert "<script" not in text.lower(), "a server's tool name reached the page unescaped"
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
        servers = {row[0]: row for row in tables["mcp-servers"][1:]}
        assert set(servers) == {"evil", "time"}
        assert servers["time"][:5] == ["time", "2", ISO[LISTED_TIME], "2", "10"]
        assert servers["time"][-2:] == [f"{ISO[VERIFY_UNCHANGED]}: unchanged", "unchanged"]
        assert servers["evil"][-2:] == ["never", "drifted"]
        assert tables["mcp-servers"][0][5:8] == ["live MCP server", "simulator", "failure"]  # a snapshot's too (its manifest's list)
        assert servers["evil"][5:8] == ["3", "1", "2"]
        assert ["evil", EVIL, "2"] in tables["mcp-tools"]
        drift_rows = tables["mcp-drift"][1:]
        assert drift_rows == [
            ["evil", "record", ISO[RECORD_SEEN], "drifted", f"{EVIL}: description; new_one: added", "-", "-"],
            ["time", "verify", ISO[VERIFY_DRIFTED], "drifted", "convert_time: inputSchema.properties.tz", "get_time: content.0.text", "-"],
            ["time", "verify", ISO[VERIFY_UNCHANGED], "unchanged", "-", "-", "-"],
        ]


def test_a_source_without_mcp_records_has_no_mcp_part(tmp_path: Path) -> None:
    path = tmp_path / "store"
    db = DiskcacheStore(path)
    try:
        db.add(Record.from_answer("Data/weather_for_Data/today", "k1", {"error": "", "response": "sunny"}, "simulated", "m"), None)
    finally:
        db.close()
    got, lines = report(["--store-path", str(path)], tmp_path)
    assert got["mcp"] is None
    assert not any(line.startswith("mcp server") for line in lines)
    text, _ = page_of(["--store-path", str(path)], tmp_path, "plain")
    assert "Live MCP servers" not in text


def test_a_snapshot_whose_manifest_lists_no_simulated_entries_counts_answers_and_failures(snapshot: Path, tmp_path: Path) -> None:
    """A snapshot made before its manifest listed them (or one whose list is malformed): answers, not sources."""
    import shutil

    old = tmp_path / "old-snapshot"
    shutil.copytree(snapshot, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest.pop("mcp_simulated_entries")
    (old / "manifest.json").write_text(json.dumps(manifest))
    got, _ = report([str(old)], tmp_path)
    assert got["mcp"]["servers"]["evil"]["calls_by_source"] == {"answer": 4, "failure": 2}
