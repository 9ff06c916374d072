"""What a user sees on the command line (issue 33): closed pipes, hints, one exit-code table, ``--json``.

Every test runs the real CLI (a subprocess, or ``main`` in this process) on real files, a real store
and, for the probes, a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stabletoolbench_mirror.commands.cli import build_parser, main
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers import paths
from tests.helpers.answer_files import api, param, query
from tests.helpers.live import serve_http

DEMO = paths.REPO / "cache"
WEATHER = "Weather/demo_weather_for_Weather/current_weather"
DOCS = paths.REPO / "docs" / "json-output.md"


def cli(*args: str, cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120, **kwargs)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "stabletoolbench_mirror", *args]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(paths.REPO)
    return env


def write_config(path: Path, **data: Any) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# -- a closed pipe -----------------------------------------------------------------------------------


def filled_store(path: Path, n: int) -> Path:
    with DiskcacheStore(path) as store:
        for i in range(n):
            key = str({"q": f"{i:06d} " + "x" * 150})
            store.add(Record.from_answer(WEATHER, key, {"error": "", "response": f"answer {i}"}, "simulated", "M"), f"c{i}")
    return path


@pytest.mark.parametrize("listing", [["cache", "ls"], ["cache", "delete", "--api", WEATHER]])
def test_a_closed_pipe_ends_quietly(listing: list[str], tmp_path: Path) -> None:
    """``cache ls ... | head -1``: far more than a pipe's buffer, the reader gone after one line."""
    store = filled_store(tmp_path / "store", 1500)
    writer = subprocess.Popen(command(*listing, "--store-path", str(store)), cwd=tmp_path, env=clean_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-1"], stdin=writer.stdout, stdout=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.close()  # head holds the only reading end
    first, _ = head.communicate(timeout=120)
    errors = writer.stderr.read().decode()
    writer.stderr.close()
    assert writer.wait(timeout=120) == 0, errors
    assert "Traceback" not in errors and "BrokenPipeError" not in errors and "Exception ignored" not in errors, errors
    assert len(first.decode().splitlines()) == 1


# -- cache show and ls -------------------------------------------------------------------------------


def test_cache_show_takes_the_json_input_and_prints_times_as_ls_does(tmp_path: Path) -> None:
    api_path = "Data/is_for_Data/lookup"
    with DiskcacheStore(tmp_path / "store") as store:
        store.add(Record.from_answer(api_path, "{'is_id': 7110004}", {"error": "", "response": "found"}, "real", "relay"), "c")
    store_args = ("--store-path", str(tmp_path / "store"))
    listed = cli("cache", "ls", *store_args, cwd=tmp_path)
    header, row = listed.stdout.splitlines()
    assert header.split("\t") == ["api", "key", "source", "origin", "outcome", "created_at", "size"]
    created_at = row.split("\t")[5]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created_at)
    # --json has no header: every line is one record
    assert [json.loads(line)["key"] for line in cli("cache", "ls", "--json", *store_args, cwd=tmp_path).stdout.splitlines()] == [
        "{'is_id': 7110004}"]
    for given in ('{"is_id": 7110004}', "{'is_id': 7110004}"):  # the JSON input the user has, and the key as ls prints it
        shown = cli("cache", "show", api_path, given, *store_args, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert data["key"] == "{'is_id': 7110004}" and data["answer"] == {"error": "", "response": "found"}
        assert data["created_at"] == created_at
    assert cli("cache", "show", api_path, '{"is_id": 1}', *store_args, cwd=tmp_path).returncode == 1


# -- a tools folder one level too high ---------------------------------------------------------------


def weather_queries(tmp_path: Path) -> Path:
    queries = tmp_path / "queries.json"
    queries.write_text(json.dumps([query(1, [api("Weather", "Demo Weather", "Current Weather", required=[param("city", "STRING", "Paris")])])]))
    return queries


def test_a_tools_folder_one_level_too_high_names_the_folder_below(tmp_path: Path) -> None:
    server = tmp_path / "server"
    shutil.copytree(DEMO / "tools", server / "tools")
    queries = weather_queries(tmp_path)
    high = cli("tools", "export", str(tmp_path / "f.jsonl"), "--queries", str(queries), "--tools", str(server), "-q", cwd=tmp_path)
    assert high.returncode == 2, high.stdout + high.stderr
    assert f"the folder below, {server / 'tools'}, looks like a tools folder: use that path" in high.stderr
    assert not (tmp_path / "f.jsonl").exists()
    config = write_config(tmp_path / "c.yml", store={"path": str(tmp_path / "store")}, frozen_caches=[str(DEMO / "frozen")], tools_folder=str(server))
    doctor = cli("doctor", "--config", str(config), "--no-probe", cwd=tmp_path)
    assert f"the folder below, {server / 'tools'}, looks like a tools folder: use that path" in doctor.stdout, doctor.stdout
    # a right folder whose tools the queries do not name: nothing exported is an error, not "0 queries" and 0
    other = tmp_path / "other.json"
    other.write_text(json.dumps([query(2, [api("Data", "TheClique", "Songkick artist")])]))
    none = cli("tools", "export", str(tmp_path / "g.jsonl"), "--queries", str(other), "--tools", str(server / "tools"), "-q", cwd=tmp_path)
    assert none.returncode == 1 and "no query's functions were exported" in none.stderr, none.stdout + none.stderr
    done = cli("tools", "export", str(tmp_path / "h.jsonl"), "--queries", str(queries), "--tools", str(server / "tools"), "-q", cwd=tmp_path)
    assert done.returncode == 0 and "exported the functions of 1 queries" in done.stdout


# -- doctor and an endpoint that answers 404 ---------------------------------------------------------


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"<html>404 Not Found</html>"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def not_found() -> Iterator[str]:
    with serve_http(NotFound) as url:
        yield url


def test_doctor_calls_a_simulator_endpoint_answering_404_an_error(not_found: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yml", store={"path": str(tmp_path / "store")}, tools_folder=str(DEMO / "tools"),
                          simulator={"enabled": True, "api_base": not_found})  # the /v1 left out
    doctor = cli("doctor", "--config", str(config), cwd=tmp_path)
    assert doctor.returncode == 1, doctor.stdout
    assert f"error: simulator.api_base: {not_found} answered HTTP 404 without a models list at {not_found}/models" in doctor.stdout
    assert "no errors" not in doctor.stdout
    report = json.loads(cli("doctor", "--config", str(config), "--json", cwd=tmp_path).stdout)
    assert not report["ok"] and [e["key"] for e in report["errors"]] == ["simulator.api_base"]


def test_doctor_passes_a_simulator_endpoint_without_a_models_list_that_answers_chat_completions(tmp_path: Path) -> None:
    """An OpenAI-compatible server with no ``/v1/models`` (HTTP 404) that answers chat completions: ``warm`` uses it,
    so ``doctor`` passes it, saying so; one whose chat completions fail too is still an error."""
    from tests.helpers.openai_stub import OpenAIStub, Reply, echo_responder

    def config(stub: OpenAIStub) -> Path:
        return write_config(tmp_path / "c.yml", store={"path": str(tmp_path / "store")}, tools_folder=str(DEMO / "tools"),
                            frozen_caches=[str(DEMO / "frozen")], simulator={"enabled": True, "api_base": stub.api_base})

    with OpenAIStub(echo_responder, models=False) as stub:
        doctor = cli("doctor", "--config", str(config(stub)), cwd=tmp_path)
        asked = list(stub.requests)
    assert doctor.returncode == 0, doctor.stdout
    assert f"{stub.api_base}: answered (HTTP 404, no models list at /models, but a chat completion of 'MirrorAPI' was answered)" in doctor.stdout
    assert "simulator.api_base" not in doctor.stdout and "no errors, 0 warning(s)" in doctor.stdout, doctor.stdout
    assert [(r["model"], r["max_tokens"]) for r in asked] == [("MirrorAPI", 1)]
    with OpenAIStub(lambda body: Reply(status=500), models=False) as stub:
        failed = cli("doctor", "--config", str(config(stub)), "--json", cwd=tmp_path)
    report = json.loads(failed.stdout)
    assert failed.returncode == 1 and [e["key"] for e in report["errors"]] == ["simulator.api_base"]
    assert f"no chat completion at {stub.api_base}/chat/completions (chat completion: HTTP 500)" in report["errors"][0]["message"]


# -- names holding terminal control characters ------------------------------------------------------

#: what a hostile tree may put in its names and keys: clear the screen, retitle the window, a C1 CSI, a bidi override
HOSTILE = ("\x1b[2J", "\x1b]0;pwned\x07", "\x9b31m", "\u202e")


def raw_controls(text: str) -> list[str]:
    return [c for c in text if c in "\x1b\x07\x9b\u202e"]


def test_names_with_terminal_control_characters_are_shown_escaped_and_json_stays_exact(tmp_path: Path) -> None:
    """A tree whose folder, file and key names hold ESC sequences, imported: every command that prints them shows
    them escaped (``\\u001b``), and ``--json`` decodes to the exact names."""
    tool = tmp_path / "tree" / "Data" / f"evil{HOSTILE[0]}_for_Data"
    tool.mkdir(parents=True)
    key = "{'q': '" + HOSTILE[1] + HOSTILE[3] + "'}"  # raw in the file's JSON (str() of a dict would escape them)
    (tool / f"api{HOSTILE[2]}.json").write_text(json.dumps({key: {"error": "", "response": "ok"}}))
    store = ("--store-path", str(tmp_path / "store"))
    assert cli("cache", "import", str(tmp_path / "tree"), *store, "-q", cwd=tmp_path).returncode == 0
    api = f"Data/evil{HOSTILE[0]}_for_Data/api{HOSTILE[2]}"
    shown = {
        "ls": cli("cache", "ls", *store, cwd=tmp_path),
        "delete": cli("cache", "delete", "--category", "Data", *store, cwd=tmp_path),
        "show": cli("cache", "show", api, key, *store, cwd=tmp_path),
        "diff": cli("cache", "diff", "store", str(DEMO / "frozen"), *store, "--show", "5", "-q", cwd=tmp_path),
        "export": cli("cache", "export", str(tmp_path / "out"), *store, "-q", cwd=tmp_path),
        "snapshot": cli("snapshot", str(tmp_path / "snap"), *store, "-q", cwd=tmp_path),
    }
    for name, done in shown.items():
        assert raw_controls(done.stdout + done.stderr) == [], (name, done.stdout, done.stderr)
    assert "evil\\u001b[2J_for_Data/api\\u009b31m" in shown["ls"].stdout and "\\u001b]0;pwned\\u0007\\u202e" in shown["ls"].stdout
    assert "evil\\u001b[2J" in shown["delete"].stdout and "\\u009b31m" in shown["diff"].stdout
    assert json.loads(shown["show"].stdout)["key"] == key
    listed = [json.loads(line) for line in cli("cache", "ls", *store, "--json", cwd=tmp_path).stdout.splitlines()]
    assert [(r["api"], r["key"]) for r in listed] == [(api, key)] and HOSTILE[0] in listed[0]["origin"]
    deleted = json.loads(cli("cache", "delete", "--category", "Data", *store, "--json", cwd=tmp_path).stdout)
    assert deleted["by_api"] == {api: 1}


# -- one exit-code table ----------------------------------------------------------------------------


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command of the parser, as its words and its parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 - argparse offers no public walk
    if not subs:
        yield prefix, parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaf_commands(sub, (*prefix, name))


def required_arguments(parser: argparse.ArgumentParser, missing: str) -> list[str]:
    """Each required argument given a path that does not exist."""
    out: list[str] = []
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public walk
        if not action.option_strings and action.nargs != 0 and action.dest != "help":
            out.append(missing)
        elif action.required:
            out += [action.option_strings[0], missing]
    return out


def test_every_command_exits_2_when_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 ok, 1 found differences or errors, 2 could not run: a config typo and an unknown flag are 2 everywhere."""
    typo = write_config(tmp_path / "typo.yml", stor={"path": str(tmp_path / "store")})
    missing = str(tmp_path / "nope")
    commands = list(leaf_commands(build_parser()))
    assert len(commands) >= 18 and ("doctor",) in [words for words, _ in commands]
    held = socket.socket()  # a server without a config (demo-models) cannot run on a port in use
    held.bind(("127.0.0.1", 0))
    held.listen()
    for words, parser in commands:
        args = [*words, *required_arguments(parser, missing)]
        if "--config" in parser._option_string_actions:  # noqa: SLF001 - argparse offers no public walk
            args += ["--config", str(typo)]
        elif "--port" in parser._option_string_actions:  # noqa: SLF001
            args += ["--port", str(held.getsockname()[1])]
        assert main(args) == 2, words
        assert "error" in capsys.readouterr().err.lower(), words
        with pytest.raises(SystemExit) as stopped:
            main([*words, "--no-such-flag"])
        assert stopped.value.code == 2, words
        capsys.readouterr()
    held.close()


def test_snapshot_verify_of_nothing_to_verify_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Row 2: a path that does not exist cannot be read (2), never a mismatch (1); nor can a folder that is no snapshot."""
    not_a_snapshot = tmp_path / "plain"
    not_a_snapshot.mkdir()
    for path, said in ((tmp_path / "missing", "does not exist"), (tmp_path / "missing.tar.gz", "does not exist"),
                       (not_a_snapshot, "has no manifest.json")):
        for json_flag in ([], ["--json"]):
            assert main(["snapshot", "--verify", str(path), "-q", *json_flag]) == 2, (path, json_flag)
            out = capsys.readouterr()
            assert said in out.err and out.out == "", (path, out)


#: long-running servers: their 2 is walked above, their 0 is a clean stop (tests/integration/test_serve_launch.py, test_mcp_front.py,
#: test_demo_models.py)
SERVERS = {("serve",), ("mcp",), ("demo-models",)}
#: runs StableToolBench's own scripts from ../shared/reference: its 0, 1, 3 and 130 are asserted by tests/integration/test_score.py
UPSTREAM_RUNS = {("score",)}
#: asks live MCP servers again: its 0 (no drift) and 1 (a tool's schema or answer changed) are asserted by
#: tests/integration/test_live_mcp.py with real servers
LIVE_MCP = {("mcp-verify",)}
TOO_LONG = "L" * 300


def documented_ones() -> set[str]:
    """The commands the table's row 1 names: what each exits 1 on."""
    row = next(line for line in DOCS.read_text().split("## Exit codes", 1)[1].splitlines() if line.startswith("| 1 |"))
    return {name for name in re.findall(r"`([a-z][a-z -]*)`", row) if not name.startswith("-")}


def test_every_command_exits_0_when_all_is_well_and_1_on_what_the_table_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each command run as a user would, once where nothing is wrong (0) and, for each command row 1 names, once
    on what it names (1); every command of the parser is run at least once."""
    from tests.helpers.openai_stub import OpenAIStub, Reply, echo_responder

    store = ("--store-path", str(tmp_path / "store"))
    config = write_config(tmp_path / "c.yml", store={"path": str(tmp_path / "store")}, tools_folder=str(DEMO / "tools"))
    payload = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather", "tool_input": '{"city": "Paris"}'}
    assert main(["cache", "import", str(DEMO / "frozen"), *store, "-q"]) == 0
    with DiskcacheStore(tmp_path / "store") as opened:
        recorded = opened.get(WEATHER, "{'city': 'Paris'}")
    assert recorded is not None
    same, other = tmp_path / "same.jsonl", tmp_path / "other.jsonl"
    same.write_text(json.dumps({"payload": payload, "observed": recorded.answer}) + "\n")
    other.write_text(json.dumps({"payload": payload, "observed": {"error": "", "response": "another answer"}}) + "\n")
    bad_tree = tmp_path / "bad_tree" / "Tools" / "t_for_Tools"
    bad_tree.mkdir(parents=True)
    (bad_tree / "good.json").write_text(json.dumps({"{'a': 1}": {"error": "", "response": "ok"}}))
    (bad_tree / "bad.json").write_text("{ not json")
    long_store = tmp_path / "long_store"  # an entry whose names are too long for a file name: an export leaves it out
    with DiskcacheStore(long_store) as opened:
        opened.add(Record.from_answer(f"{TOO_LONG}/tool_for_{TOO_LONG}/api", "{'a': 1}", {"error": "", "response": "x"}, "simulated", "m"),
                   None)
    no_frozen = write_config(tmp_path / "nofrozen.yml", store={"path": str(tmp_path / "store")}, frozen_caches=[str(tmp_path / "nope")])
    nothing = tmp_path / "nothing.json"
    nothing.write_text(json.dumps([query(2, [api("Data", "TheClique", "Songkick artist")])]))

    def changed_snapshot() -> None:  # one answer of the snapshot's files changed after it was written
        path = next(p for p in (tmp_path / "snap").rglob("*.json") if p.name != "manifest.json")
        data = json.loads(path.read_text())
        data[next(iter(data))] = {"error": "", "response": "changed"}
        path.write_text(json.dumps(data))

    def changed_bundle() -> None:  # a score bundle of the snapshot, one file changed after its seal
        from stabletoolbench_mirror.scoring import bundle

        root = tmp_path / "bundle"
        shutil.copytree(tmp_path / "snap", root / "records")
        (root / "run.json").write_text(json.dumps({"label": "run", "groups": []}))
        bundle.seal(root)
        (root / "run.json").write_text(json.dumps({"label": "run", "groups": [], "changed": True}))

    def failing(body: dict[str, Any]) -> Reply:  # the simulator fails the call of "Nowhere"
        return Reply(status=500) if "Nowhere" in json.dumps(body) else echo_responder(body)

    runs: list[Any] = [  # (the command's words, its arguments, the status expected), or a step between them
        (("doctor",), ["--config", str(config), "--no-probe"], 0),
        (("doctor",), ["--config", str(no_frozen), "--no-probe"], 1),
        (("check",), ["--config", str(config), "--calls", str(same), "-q"], 0),
        (("check",), ["--config", str(config), "--calls", str(other), "-q"], 1),
        (("check",), ["--config", str(config), "--calls", str(other), "--report-only", "-q"], 0),
        (("fidelity",), ["--config", str(config), "--calls", str(same), "--candidate-calls", str(same), "-q"], 0),
        (("fidelity",), ["--config", str(config), "--calls", str(tmp_path / "empty.jsonl"), "-q"], 1),
        (("cache", "stats"), [*store], 0),
        (("cache", "ls"), [*store], 0),
        (("cache", "show"), [WEATHER, "{'city': 'Paris'}", *store], 0),
        (("cache", "show"), [WEATHER, "{'city': 'Atlantis'}", *store], 1),
        (("cache", "delete"), ["--api", WEATHER, *store], 0),  # without --yes: what it would delete
        (("cache", "import"), [str(bad_tree.parent.parent), "--store-path", str(tmp_path / "bad_store"), "-q"], 1),
        (("cache", "export"), [str(tmp_path / "export"), *store, "-q"], 0),
        (("cache", "export"), [str(tmp_path / "export_long"), "--store-path", str(long_store), "-q"], 1),
        (("snapshot",), [str(tmp_path / "snap"), *store, "-q"], 0),
        (("snapshot",), [str(tmp_path / "snap_long"), "--store-path", str(long_store), "-q"], 1),
        (("snapshot", "--verify"), [str(tmp_path / "snap"), "-q"], 0),
        (("cache", "diff"), ["store", str(tmp_path / "snap"), "--config", str(config), "-q"], 0),
        changed_bundle,
        (("report",), [str(tmp_path / "bundle"), "--json-out", str(tmp_path / "bundle.json"), "-q"], 1),
        changed_snapshot,
        (("snapshot", "--verify"), [str(tmp_path / "snap"), "-q"], 1),
        (("cache", "diff"), ["store", str(tmp_path / "snap"), "--config", str(config), "-q"], 1),
        (("report",), [str(tmp_path / "snap"), "--json-out", str(tmp_path / "report.json"), "-q"], 0),
        (("faults", "profile"), [str(DEMO / "frozen"), "-q"], 0),
        (("sessions", "export"), [str(tmp_path / "sessions.jsonl"), *store], 0),
        (("tools", "export"), [str(tmp_path / "f.jsonl"), "--queries", str(weather_queries(tmp_path)), "--config", str(config), "-q"], 0),
        (("tools", "export"), [str(tmp_path / "g.jsonl"), "--queries", str(nothing), "--config", str(config), "-q"], 1),
    ]
    (tmp_path / "empty.jsonl").write_text("")
    seen: dict[tuple[str, ...], set[int]] = {}
    for run in runs:
        if callable(run):
            run()
            continue
        words, args, expected = run
        got = main([*(w for w in words if w != "--verify"), *(["--verify"] if "--verify" in words else []), *args])
        out = capsys.readouterr()
        assert got == expected, (words, args, expected, got, out.out[-2000:], out.err[-2000:])
        seen.setdefault(tuple(w for w in words if w != "--verify"), set()).add(expected)
        if words != tuple(w for w in words if w != "--verify"):
            seen.setdefault(words, set()).add(expected)
    payloads = tmp_path / "payloads.jsonl"
    payloads.write_text("".join(json.dumps({**payload, "tool_input": json.dumps({"city": city})}) + "\n" for city in ("Lyon", "Nowhere")))
    with OpenAIStub(failing) as stub:
        warm_config = write_config(tmp_path / "warm.yml", store={"path": str(tmp_path / "warm_store")}, tools_folder=str(DEMO / "tools"),
                                   simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0})
        for lines, expected in ((1, 0), (2, 1)):  # Lyon simulated; then Nowhere failed (Lyon now cached)
            (tmp_path / "p.jsonl").write_text("".join(payloads.read_text().splitlines(keepends=True)[:lines]))
            got = main(["warm", "--config", str(warm_config), "--payloads", str(tmp_path / "p.jsonl"), "-q"])
            out = capsys.readouterr()
            assert got == expected, (lines, got, out.out[-2000:], out.err[-2000:])
            seen.setdefault(("warm",), set()).add(expected)
    commands = {words for words, _ in leaf_commands(build_parser())}
    assert commands - SERVERS - UPSTREAM_RUNS - LIVE_MCP - set(seen) == set(), "commands never run with a 0 or 1 expected"
    ones = {" ".join(words) for words, codes in seen.items() if 1 in codes}
    # check --apibank's 1 (a call scored wrong) is asserted by tests/integration/test_apibank.py's check(), score's by test_score.py,
    # mcp-verify's (drift) by test_live_mcp.py
    assert documented_ones() - ones - {"check --apibank", "score --replay", "mcp-verify"} == set(), "row 1 names a command not run to its 1"


def test_a_mistyped_store_path_is_exit_2_for_every_command_that_reads_a_store_and_no_store_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Row 2's "a store that cannot be opened": a reading command never makes an empty store at a mistyped path and then
    reports (or snapshots, or exports) nothing with 0."""
    missing = tmp_path / "typo"
    store = ("--store-path", str(missing))
    readers = [
        ["cache", "stats", *store], ["cache", "ls", *store], ["cache", "show", WEATHER, "{'city': 'Paris'}", *store],
        ["cache", "delete", "--api", WEATHER, *store], ["cache", "export", str(tmp_path / "out"), *store, "-q"],
        ["cache", "export", str(tmp_path / "out.jsonl"), "--format", "chat-jsonl", "--style", "mirrorapi-sft", *store, "-q"],
        ["snapshot", str(tmp_path / "snap"), *store, "-q"], ["cache", "diff", "store", str(DEMO / "frozen"), *store, "-q"],
        ["report", "store", "--json-out", str(tmp_path / "r.json"), *store, "-q"],
    ]
    for args in readers:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "no diskcache store at" in err and "check store.path" in err, (args, err)
        assert not missing.exists(), args
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_readme_points_at_the_one_table() -> None:
    readme = (paths.REPO / "README.md").read_text()
    assert "docs/json-output.md#exit-codes" in readme
    table = DOCS.read_text().split("## Exit codes", 1)[1].split("##", 1)[0]
    assert [line.split("|")[1].strip() for line in table.splitlines() if re.match(r"\| \d", line)] == ["0", "1", "2", "3", "130"]


# -- --json ------------------------------------------------------------------------------------------


def documented_keys() -> dict[str, list[str]]:
    """docs/json-output.md: each ``### `COMMAND --json` `` section's table of keys."""
    out: dict[str, list[str]] = {}
    for section in DOCS.read_text().split("\n### ")[1:]:
        title = section.split("`")[1]
        out[title] = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    return out


def test_every_reporting_command_prints_its_documented_json(tmp_path: Path) -> None:
    docs = documented_keys()
    store = ("--store-path", str(tmp_path / "store"))
    config = write_config(tmp_path / "c.yml", store={"path": str(tmp_path / "store")}, tools_folder=str(DEMO / "tools"))
    assert cli("cache", "import", str(DEMO / "frozen"), *store, "-q", cwd=tmp_path).returncode == 0
    payload = {"category": "Weather", "tool_name": "Demo Weather", "api_name": "Current Weather", "tool_input": '{"city": "Paris"}'}
    with DiskcacheStore(tmp_path / "store") as opened:
        recorded = opened.get(WEATHER, "{'city': 'Paris'}")
    assert recorded is not None
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps({"payload": payload, "observed": recorded.answer}) + "\n")
    payloads = tmp_path / "payloads.jsonl"
    payloads.write_text(json.dumps(payload) + "\n")
    runs = {
        "doctor --json": ["doctor", "--config", str(config), "--no-probe"],
        "warm --json": ["warm", "--config", str(config), "--payloads", str(payloads), "--dry-run"],
        "snapshot --json": ["snapshot", str(tmp_path / "snap"), "--config", str(config), "-q"],
        "snapshot --verify --json": ["snapshot", "--verify", str(tmp_path / "snap"), "-q"],
        "check --json": ["check", "--config", str(config), "--calls", str(calls), "-q"],
        "faults profile --json": ["faults", "profile", str(DEMO / "frozen"), "-q"],
        "tools export --json": ["tools", "export", str(tmp_path / "f.jsonl"), "--queries", str(weather_queries(tmp_path)), "--config", str(config), "-q"],
        "cache stats --json": ["cache", "stats", *store],
        "cache diff --json": ["cache", "diff", "store", str(tmp_path / "snap"), "--config", str(config), "-q"],
        "report --json": ["report", str(tmp_path / "snap"), "-q"],
        "cache import --json": ["cache", "import", str(DEMO / "frozen"), "--store-path", str(tmp_path / "store2"), "-q"],
        "cache export --json": ["cache", "export", str(tmp_path / "tree"), *store, "-q"],
        "cache export --format chat-jsonl --json": ["cache", "export", str(tmp_path / "chat.jsonl"), "--format", "chat-jsonl",
                                                    "--style", "mirrorapi-sft", "--config", str(config), "-q"],
        "cache delete --json": ["cache", "delete", "--api", WEATHER, *store],
        "sessions export --json": ["sessions", "export", str(tmp_path / "sessions.jsonl"), *store],
    }
    # score --json's keys: checked by tests/integration/test_score.py (it runs StableToolBench's own scripts)
    assert set(runs) | {"cache ls --json", "score --json"} == set(docs)
    for title, args in runs.items():  # in this order: the snapshot is made before it is verified and compared
        done = cli(*args, "--json", cwd=tmp_path)
        assert done.returncode == 0, (title, done.stdout, done.stderr)
        data = json.loads(done.stdout)
        assert sorted(data) == sorted(docs[title]), title
    lines = cli("cache", "ls", *store, "--json", cwd=tmp_path).stdout.splitlines()
    assert len(lines) == 5 and all(sorted(json.loads(line)) == sorted(docs["cache ls --json"]) for line in lines)
    # the figures are the text's: what the import read and added, what delete matched, what export wrote
    imported = json.loads(cli("cache", "import", str(DEMO / "frozen"), "--store-path", str(tmp_path / "store3"), "-q", "--json",
                              cwd=tmp_path).stdout)
    assert (imported["files"], imported["entries"], imported["added"], imported["already_present"], imported["unreadable"]) == (3, 5, 5, 0, [])
    deleted = json.loads(cli("cache", "delete", "--api", WEATHER, "--yes", "--store-path", str(tmp_path / "store3"), "--json",
                             cwd=tmp_path).stdout)
    assert deleted["yes"] and deleted["matched"] == deleted["deleted"] == deleted["by_api"][WEATHER] > 0 and deleted["apis"] == 1
    exported = json.loads(cli("cache", "export", str(tmp_path / "tree3"), "--store-path", str(tmp_path / "store3"), "-q", "--json",
                              cwd=tmp_path).stdout)
    assert exported["ok"] and exported["entries"] == 5 - deleted["deleted"] and exported["left_out"] == {}


def test_every_command_but_the_servers_takes_json() -> None:
    """The README: every command that reports takes ``--json``."""
    for words, parser in leaf_commands(build_parser()):
        if words not in SERVERS:
            assert "--json" in parser._option_string_actions, words  # noqa: SLF001 - argparse offers no public walk
