"""API names unsafe as paths: `cache export` and `snapshot` write them encoded (nothing silently left out),
report what cannot be written at all, and `snapshot --verify` never says OK for an incomplete snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests

from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.stores import DiskcacheStore
from stabletoolbench_mirror.upstream.archives import tree_hash
from stabletoolbench_mirror.upstream.layout import decode_name, encode_name
from tests.conftest import REPO
from tests.helpers.openai_stub import OpenAIStub, echo_prompt_responder

#: /virtual names whose cache folder or file would be unsafe as a path (or ambiguous) as they are
UNSAFE = [
    ("..", "Tool", "Api"),  # category ".." (a parent folder)
    (".", "Tool", "Api"),
    ("a\\b", "Tool", "Api"),  # a backslash
    ("Data", "x/../../escape_for_Data", "Api"),  # a raw tool folder (it ends in _for_<category>) with slashes
    ("%%lit", "Tool", "Api"),  # a name that looks encoded
    ("Data", "Tool", "Api"),  # a safe one, for comparison
    ("50% off", "Tool", "Api"),  # '%' alone stays literal
]
TOO_LONG = "L" * 300


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def body(category: str, tool: str, api: str, n: int = 0) -> dict:
    return {"category": category, "tool_name": tool, "api_name": api, "tool_input": json.dumps({"n": n}), "strip": "", "toolbench_key": ""}


def store_content(path: Path) -> dict[tuple[str, str], str]:
    with DiskcacheStore(path) as store:
        return {(r.api, r.key): r.body for r in store}


def test_encoded_names_round_trip() -> None:
    for name in ["", ".", "..", "a/b", "a\\b", "x\x00y", "\n", "\ud800", "%%x", "%", "Data", "中文", "x" * 240]:
        encoded = encode_name(name)
        assert encoded is not None and "/" not in encoded and "\\" not in encoded and encoded not in (".", "..", "")
        assert decode_name(encoded) == name
    # safe names stay exactly as upstream writes them
    assert encode_name("Data") == "Data" and encode_name("50% off") == "50% off"
    assert encode_name("x" * 241) is None


def test_unsafe_names_exported_served_from_a_snapshot_and_imported_back(tmp_path: Path, serve, settings_factory) -> None:
    # record answers for unsafe names through the real server, as a benchmark run would
    with OpenAIStub(echo_prompt_responder) as stub:
        recorder = serve(settings_factory(simulator={"enabled": True, "api_base": stub.api_base, "max_retries": 0}))
        served = {}
        for n, names in enumerate(UNSAFE):
            reply = recorder.post(body(*names, n))
            assert reply.status_code == 200 and reply.headers["X-STM-Outcome"] == "recorded", reply.text
            served[names] = reply.text
    recorded = store_content(tmp_path / "store")
    assert len(recorded) == len(UNSAFE)

    # export: every entry written, the unsafe ones under encoded names inside the export folder
    exported = cli("cache", "export", str(tmp_path / "export"), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert f"entries written:  {len(UNSAFE)}" in exported.stdout and "encoded names:    5 files" in exported.stdout
    files = [p for p in (tmp_path / "export").rglob("*.json")]
    assert len(files) == len(UNSAFE) and all(p.resolve().is_relative_to((tmp_path / "export").resolve()) for p in files)
    assert not (tmp_path / "escape_for_Data").exists()
    # import of the export gives back the same store
    imported = cli("cache", "import", str(tmp_path / "export"), "--store-path", str(tmp_path / "again"), "-q", cwd=tmp_path)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert store_content(tmp_path / "again") == recorded  # the export holds the store's entries, and only them

    # snapshot: complete, verifies, same hash as the store's own entries
    snap = cli("snapshot", str(tmp_path / "snap"), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert snap.returncode == 0, snap.stdout + snap.stderr
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["entries"] == manifest["store_entries"] == len(UNSAFE) and manifest["left_out"] == {}
    assert manifest["content_hash"] == tree_hash(tmp_path / "export", progress=False)
    verified = cli("snapshot", "--verify", str(tmp_path / "snap"), cwd=tmp_path)
    assert verified.returncode == 0 and "OK" in verified.stdout, verified.stdout

    # the snapshot served as a frozen cache answers every call byte for byte, with nothing recorded
    replay = serve(settings_factory(mode="replay", store={"path": str(tmp_path / "empty")}, frozen_caches=[str(tmp_path / "snap")]))
    for n, names in enumerate(UNSAFE):
        reply = replay.post(body(*names, n))
        assert reply.headers["X-STM-Outcome"] == "hit" and reply.text == served[names], names
    assert requests.get(replay.url + "/stats", timeout=5).json()["hits"] == len(UNSAFE)


def test_entries_that_cannot_be_written_are_reported_and_fail_unless_skipped(tmp_path: Path) -> None:
    records = [
        Record.from_answer("Data/tool_for_Data/ok", "{'a': 1}", {"error": "", "response": "fine"}, "simulated", "m"),
        Record.from_answer(f"{TOO_LONG}/tool_for_{TOO_LONG}/api", "{'a': 1}", {"error": "", "response": "long"}, "simulated", "m"),
        Record.from_answer(f"{TOO_LONG}/tool_for_{TOO_LONG}/api", "{'a': 2}", {"error": "", "response": "long 2"}, "simulated", "m"),
    ]
    with DiskcacheStore(tmp_path / "store") as store:
        for record in records:
            store.add(record, canonical_from_upstream_key(record.key))
    store_args = ("--store-path", str(tmp_path / "store"), "-q")

    export = cli("cache", "export", str(tmp_path / "e1"), *store_args, cwd=tmp_path)
    assert export.returncode == 1 and "LEFT OUT:         2 entries of 1 APIs" in export.stdout and "incomplete" in export.stderr
    assert "entries written:  1" in export.stdout
    skipped = cli("cache", "export", str(tmp_path / "e2"), *store_args, "--skip-unsafe", cwd=tmp_path)
    assert skipped.returncode == 0 and "LEFT OUT:         2 entries" in skipped.stdout

    snap = cli("snapshot", str(tmp_path / "s1"), *store_args, cwd=tmp_path)
    assert snap.returncode == 1 and "LEFT OUT:      2 entries" in snap.stdout, snap.stdout + snap.stderr
    manifest = json.loads((tmp_path / "s1" / "manifest.json").read_text())
    assert manifest["entries"] == 1 and manifest["store_entries"] == 3 and list(manifest["left_out"].values()) == [2]
    # the files match the manifest, but the snapshot does not hold what the store serves: never OK
    verify = cli("snapshot", "--verify", str(tmp_path / "s1"), cwd=tmp_path)
    assert verify.returncode == 1 and "FAILED" in verify.stdout and "incomplete" in verify.stdout
    assert cli("snapshot", "--verify", str(tmp_path / "s1"), "--skip-unsafe", cwd=tmp_path).returncode == 0

    accepted = cli("snapshot", str(tmp_path / "s2"), *store_args, "--skip-unsafe", cwd=tmp_path)
    assert accepted.returncode == 0 and "LEFT OUT" in accepted.stdout
