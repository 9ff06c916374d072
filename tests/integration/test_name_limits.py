"""Names a client sends are bounded: too long or with control characters -> HTTP 422 naming the rule.

The attack this guards against: distinct 600 KB names in every request grew a server from
97 MB to 982 MB RSS and its log by 180 MB.  A name is refused before it reaches a table, a log
line or the store; what is accepted is bounded by size in every table it reaches.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from stabletoolbench_mirror.core import logs
from stabletoolbench_mirror.core.naming import resolve_names
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import MAX_NAME_CHARS
from stabletoolbench_mirror.engine import stats as stats_module
from stabletoolbench_mirror.engine.layer import MirrorLayer
from stabletoolbench_mirror.engine.stats import Stats
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream import tooldocs as tooldocs_module
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs
from tests.helpers.payloads import answer_payload
from tests.helpers.processes import ServeProcess, StubProcess
from tests.helpers.responders import KeyedResponder, expected_answer

NAMES = ("category", "tool_name", "api_name")
GOOD = {"category": "Data", "tool_name": "Name Tool", "api_name": "api", "tool_input": '{"q": 1}', "strip": "", "toolbench_key": ""}


@pytest.fixture
def keyed_server(tmp_path: Path, serve, settings_factory):
    layer = MirrorLayer(DiskcacheStore(tmp_path / "store"), responders=[KeyedResponder()])
    return serve(settings_factory(), layer), layer


def test_real_toolbench_names_are_far_below_the_limit(reference_dir: Path) -> None:
    longest = dict.fromkeys(NAMES, 0)
    for path in sorted((reference_dir / "solvable_queries").glob("*.json")):
        for query in json.loads(path.read_text()):
            for api in query["api_list"]:
                for field, name in zip(NAMES, (api["category_name"], api["tool_name"], api["api_name"])):
                    longest[field] = max(longest[field], len(name))
    for path in (reference_dir / "toolenv" / "tools").glob("*/*.json"):
        doc = json.loads(path.read_text())
        longest["category"] = max(longest["category"], len(path.parent.name))
        longest["tool_name"] = max(longest["tool_name"], len(doc.get("tool_name", "")))
        longest["api_name"] = max(longest["api_name"], *(len(a["name"]) for a in doc["api_list"]))
    print(f"longest names in the reference data: {longest}; limit {MAX_NAME_CHARS}")
    assert 0 < max(longest.values()) * 8 < MAX_NAME_CHARS


@pytest.mark.parametrize("field", NAMES)
def test_a_name_over_the_limit_gets_422_naming_the_limit(keyed_server, field: str) -> None:
    server, layer = keyed_server
    r = server.post({**GOOD, field: "x" * (MAX_NAME_CHARS + 1)})
    assert r.status_code == 422
    error = r.json()["error"]
    assert field in error and f"at most {MAX_NAME_CHARS} characters" in error and len(error) < 300
    assert r.json()["response"] == ""
    at_limit = server.post({**GOOD, field: "y" * MAX_NAME_CHARS})
    assert at_limit.status_code == 200 and at_limit.json()["error"] == ""
    assert len(layer.store) == 1  # only the accepted one was recorded


@pytest.mark.parametrize("field", NAMES)
@pytest.mark.parametrize("char", ["\x00", "\x01", "\n", "\t", "\x1f", "\x7f", "\x85", "\x9f"])
def test_control_characters_in_names_get_422(keyed_server, field: str, char: str) -> None:
    server, layer = keyed_server
    r = server.post({**GOOD, field: f"Na{char}me"})
    assert r.status_code == 422, r.text
    assert field in r.json()["error"] and f"U+{ord(char):04X}" in r.json()["error"]
    assert len(layer.store) == 0


def test_names_with_nul_cannot_collide_in_the_diskcache_key(keyed_server, tmp_path: Path) -> None:
    """Two different calls whose (api, key) joined with NUL would be the same diskcache key."""
    server, layer = keyed_server
    # api "Data/t_for_Data/api" + key "zz_for_Data/k\0K"  vs  api "Data/t_for_Data/api\0zz_for_Data/k" + key "K"
    first = {**GOOD, "category": "Data", "tool_name": "t_for_Data", "api_name": "api", "tool_input": json.dumps("zz_for_Data/k\x00K")}
    second = {**GOOD, "category": "Data", "tool_name": "t_for_Data/api\x00zz_for_Data", "api_name": "k", "tool_input": json.dumps("K")}
    assert server.post(first).status_code == 200
    r = server.post(second)
    assert r.status_code == 422 and "U+0000" in r.json()["error"]
    # the store itself refuses a api it could not key one-to-one
    with pytest.raises(ValueError, match="NUL"):
        layer.store.get("Data/t_for_Data/api\x00zz_for_Data/k", "K")


# -- the attack: 300 requests with distinct 600 KB names against a real server process -----------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def tools_folder(root: Path) -> Path:
    tool = root / "Data" / "name_tool.json"
    tool.parent.mkdir(parents=True)
    tool.write_text(json.dumps({"tool_name": "Name Tool", "tool_description": "d", "api_list": [{"name": "api", "description": "a"}]}))
    return root


def test_300_distinct_600kb_names_keep_rss_and_log_bounded(tmp_path: Path) -> None:
    with StubProcess(tmp_path, echo_prompt=False) as stub:
        config = {
            "mode": "record",
            "log_level": "info",
            "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
            "tools_folder": str(tools_folder(tmp_path / "tools")),
            "simulator": {"enabled": True, "api_base": stub.api_base, "max_retries": 0},
        }
        with ServeProcess(tmp_path, config) as server:
            session = requests.Session()
            for i in range(20):  # warm up: imports, thread pools, the tools index
                assert session.post(server.url + "/virtual", json={**GOOD, "tool_input": json.dumps({"w": i})}, timeout=60).status_code == 200
            rss_before, log_before = rss_bytes(server.pid), server.log.stat().st_size

            def send(i: int) -> requests.Response:
                field = NAMES[i % 3]
                name = f"{i:06d}" + "n" * 600_000  # distinct in its first characters
                return requests.post(server.url + "/virtual", json={**GOOD, field: name}, timeout=120)

            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(send, range(300)))
            stats = session.get(server.url + "/stats", timeout=60)
            rss_after, log_after = rss_bytes(server.pid), server.log.stat().st_size
    growth_mb, log_mb = (rss_after - rss_before) / 2**20, (log_after - log_before) / 2**20
    print(f"300 requests with distinct 600 KB names: RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MB "
          f"(+{growth_mb:.1f} MB), log +{log_mb:.3f} MB, /stats {len(stats.content)} bytes")
    assert growth_mb < 50 and log_mb < 5
    assert len(stats.content) < 100_000
    statuses = {r.status_code for r in answers}
    assert statuses == {422}, statuses
    assert all(f"at most {MAX_NAME_CHARS} characters" in r.json()["error"] and len(r.content) < 300 for r in answers)


# -- what is accepted stays bounded by size ----------------------------------------------------------


def test_per_api_counters_are_bounded_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats_module, "MAX_TRACKED_API_BYTES", 100_000)
    stats = Stats()
    for i in range(1000):
        names = resolve_names("C" * 1000, f"{i:04d}" + "T" * 1000, "A" * 1000)
        stats.count(Outcome("{}", OutcomeKind.UNANSWERED, api=names.api))
    tracked = [ns for ns in stats.snapshot()["by_api"] if ns != "(other)"]
    assert sum(len(ns.encode()) for ns in tracked) <= 100_000
    assert 0 < len(tracked) < 1000
    assert stats.snapshot()["by_api"]["(other)"]["misses"] == 1000 - len(tracked)
    assert stats.snapshot()["misses"] == 1000


def test_tool_doc_lookup_memory_is_bounded_by_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tooldocs_module, "MAX_REMEMBERED_CHARS", 50_000)
    monkeypatch.setattr(tooldocs_module, "MAX_LOADED_DOC_BYTES", 3_000)
    root = tmp_path / "tools"
    for i in range(10):
        doc = {"tool_name": f"Tool {i}", "tool_description": "x" * 1000, "api_list": [{"name": "api", "description": "d"}]}
        (root / "Data").mkdir(parents=True, exist_ok=True)
        (root / "Data" / f"tool_{i}.json").write_text(json.dumps(doc))
    docs = ToolDocs(root)
    for i in range(200):
        assert docs.find_by_names("Data", f"{i:04d}" + "t" * MAX_NAME_CHARS, "api") is None
        assert docs._resolved.currsize <= 50_000  # noqa: SLF001
    assert sum(len(c) + len(t) + len(a) for c, t, a in docs._resolved) <= 50_000  # noqa: SLF001
    for i in range(10):
        assert docs.find_by_names("Data", f"tool_{i}", "api") is not None
    sizes = [size for _tool, size in docs._loaded.values()]  # noqa: SLF001
    assert sum(sizes) <= 3_000 and len(sizes) < 10


# -- log lines quote a bounded part of client text ----------------------------------------------------


def test_log_lines_quote_at_most_a_few_hundred_chars_of_a_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layer = MirrorLayer(DiskcacheStore(tmp_path / "store"), mode="replay")
    with caplog.at_level(logging.INFO):
        outcome = answer_payload(layer, {**GOOD, "tool_name": "T" * MAX_NAME_CHARS, "tool_input": json.dumps({"q": "k" * 50_000})})
    assert outcome.kind == "unanswered"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("stabletoolbench_mirror")]
    assert lines and all("T" * (logs.MAX_QUOTED_CHARS + 1) not in line and "k" * (logs.MAX_QUOTED_CHARS + 1) not in line for line in lines)
    assert max(len(line) for line in lines) < 4 * logs.MAX_QUOTED_CHARS + 200


def test_log_backstop_cuts_long_messages_after_redacting_secrets() -> None:
    redactor = logs.RedactSecrets()
    secret = "sk-" + "s" * 40
    redactor.add([secret])
    text = "x" * (logs.MAX_MESSAGE_CHARS - 10) + secret + "y" * 10_000
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "value %s", (text,), None)
    assert redactor.filter(record)
    message = record.getMessage()
    assert len(message) < logs.MAX_MESSAGE_CHARS + 50 and "sk-sss" not in message and "more chars" in message


def test_access_log_quotes_a_bounded_part_of_the_path(tmp_path: Path) -> None:
    config = {"log_level": "info", "store": {"kind": "diskcache", "path": str(tmp_path / "store")}}
    with ServeProcess(tmp_path, config) as server:
        before = server.log.stat().st_size
        for i in range(20):
            r = requests.get(f"{server.url}/{i}" + "p" * 8000, timeout=30)
            assert r.status_code == 404
        with server.log.open("rb") as fh:
            fh.seek(before)
            added = fh.read().decode(errors="replace")
    assert "p" * (logs.MAX_QUOTED_CHARS + 1) not in added, added[:2000]
    assert len(added) < 20 * 1000


def test_a_recorded_call_is_unaffected_by_the_limits(keyed_server) -> None:
    server, _layer = keyed_server
    body = {**GOOD, "category": "Artificial_Intelligence_Machine_Learning", "tool_name": "Temu.com Shopping API (Realtime api scrapper from temu.com)"}
    r = server.post(body)
    names = resolve_names(body["category"], body["tool_name"], body["api_name"])
    assert r.status_code == 200 and r.json() == expected_answer(names.api, "{'q': 1}")



def test_a_file_name_with_terminal_control_characters_reaches_the_servers_output_escaped(tmp_path: Path) -> None:
    """A frozen tree whose file names hold ESC sequences (clear the screen, retitle the window, a C1 CSI, a bidi
    override): the server's start-up summary names the unreadable file with each control character escaped, so
    the terminal the server writes to is driven by nobody's file names.  (A request's names with control
    characters are refused, HTTP 422, before anything logs them.)"""
    hostile = "evil\x1b[2J\x1b]0;pwned\x07\x9b31m\u202e"
    tool = tmp_path / "tree" / "Data" / f"{hostile}_for_Data"
    tool.mkdir(parents=True)
    (tool / "api.json").write_text("{ not json")
    (tmp_path / "tree" / "Data" / "good_for_Data").mkdir()
    (tmp_path / "tree" / "Data" / "good_for_Data" / "api.json").write_text(json.dumps({"{}": {"error": "", "response": "ok"}}))
    config = {"log_level": "info", "mode": "replay", "store": {"kind": "diskcache", "path": str(tmp_path / "store")},
              "frozen_caches": [str(tmp_path / "tree")]}
    with ServeProcess(tmp_path, config) as server:
        r = requests.post(server.url + "/virtual", json={**GOOD, "category": "Data\x1b[2J"}, timeout=30)
        assert r.status_code == 422
        written = server.log.read_bytes().decode("utf-8")
    assert "cache files cannot be read" in written and "evil\\u001b[2J\\u001b]0;pwned\\u0007\\u009b31m\\u202e_for_Data" in written, written
    assert not any(c in written for c in "\x1b\x07\x9b\u202e"), written
