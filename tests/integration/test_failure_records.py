"""Failure records: a miss that ended without a usable answer is recorded as served, replayed byte for byte,
retried in record mode, kept or left out of snapshots, and counted apart by `check`, `cache stats` and /stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stabletoolbench_mirror.core.keys import canonical_from_upstream_key
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.snapshots.snapshot import verify_snapshot, write_snapshot
from stabletoolbench_mirror.stores import DiskcacheStore, FrozenCache
from stabletoolbench_mirror.upstream.layout import iter_cache_files, read_cache_file
from tests.helpers import paths

NS = "Data/flaky_for_Data/lookup"
UPSTREAM_FAILED = {"error": "Failed to generate fake response", "response": ""}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(paths.REPO)
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def answer(key: str, text: str) -> Record:
    return Record.from_answer(NS, key, {"error": "", "response": text}, "simulated", "MirrorAPI")


def failure(key: str, served: dict) -> Record:
    return Record.failure(NS, key, served, "simulated", "MirrorAPI", reason="simulator output not parsable", tried=("simulated:MirrorAPI",))


MIXED = [
    answer("{'n': 1}", "one"),
    failure("{'n': 2}", UPSTREAM_FAILED),
    answer("{'n': 3}", "three"),
    failure("{'n': 4}", {"error": "Rate limit exceeded", "response": ""}),
]


def filled(path: Path, records=MIXED) -> DiskcacheStore:
    store = DiskcacheStore(path)
    for record in records:
        store.add(record, canonical_from_upstream_key(record.key))
    return store


def tree(root: Path) -> dict[str, dict]:
    return {ns: read_cache_file(path) for ns, path in iter_cache_files(root)}


def test_snapshot_writes_failures_as_served_and_lists_them(tmp_path: Path) -> None:
    with filled(tmp_path / "store") as store:
        manifest = write_snapshot(store, tmp_path / "snap")
    # the upstream layout: the served body is the value, failures included
    assert tree(tmp_path / "snap") == {NS: {r.key: r.answer for r in MIXED}}
    assert manifest["entries"] == 4 and manifest["failures"] == 2 and manifest["excluded_failures"] == 0
    assert manifest["failure_entries"] == [[NS, "{'n': 2}"], [NS, "{'n': 4}"]]
    assert manifest["failure_reasons"] == {"simulator output not parsable": 2}
    assert verify_snapshot(tmp_path / "snap").ok
    # served as a frozen cache, the same bytes, and the failures are known as failures
    frozen = FrozenCache(tmp_path / "snap")
    for record in MIXED:
        got = frozen.get(NS, record.key)
        assert got is not None and got.body == record.body and got.is_failure == record.is_failure
    assert [r.key for r in frozen.sample(NS, 10)] == ["{'n': 1}", "{'n': 3}"]  # failures are no few-shot examples


def test_exclude_failures_leaves_exactly_those_out(tmp_path: Path) -> None:
    filled(tmp_path / "store").close()
    result = cli("snapshot", str(tmp_path / "snap"), "--exclude-failures", "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "failures:      0 included, 2 left out" in result.stdout
    assert tree(tmp_path / "snap") == {NS: {r.key: r.answer for r in MIXED if not r.is_failure}}
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["failures"] == 0 and manifest["excluded_failures"] == 2 and manifest["failure_entries"] == []
    assert cli("snapshot", "--verify", str(tmp_path / "snap"), cwd=tmp_path).returncode == 0


def test_verify_notices_a_failure_list_that_does_not_match(tmp_path: Path) -> None:
    with filled(tmp_path / "store") as store:
        write_snapshot(store, tmp_path / "snap")
    path = tmp_path / "snap" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["failure_entries"].append([NS, "{'n': 99}"])
    path.write_text(json.dumps(manifest))
    result = verify_snapshot(tmp_path / "snap")
    assert not result.ok and any("failure" in p for p in result.problems)


@pytest.mark.parametrize("jobs", ["0", "2"])  # read in this process, or by reader processes
def test_import_and_stats_keep_failures_failures(jobs: str, tmp_path: Path) -> None:
    with filled(tmp_path / "store") as store:
        write_snapshot(store, tmp_path / "snap")
    # upstream's own tree: its saved "Failed to generate fake response" is a failure too
    upstream = tmp_path / "upstream" / "Data" / "flaky_for_Data"
    upstream.mkdir(parents=True)
    (upstream / "other.json").write_text(json.dumps({"{'m': 1}": UPSTREAM_FAILED, "{'m': 2}": {"error": "", "response": "fine"}}))
    for source in (tmp_path / "snap", tmp_path / "upstream"):
        result = cli("cache", "import", str(source), "--store-path", str(tmp_path / "imported"), "--jobs", jobs, "-q", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    with DiskcacheStore(tmp_path / "imported") as store:
        kinds = {(r.api.rsplit("/", 1)[1], r.key): r.is_failure for r in store}
    assert kinds == {("lookup", "{'n': 1}"): False, ("lookup", "{'n': 2}"): True, ("lookup", "{'n': 3}"): False,
                     ("lookup", "{'n': 4}"): True, ("other", "{'m': 1}"): True, ("other", "{'m': 2}"): False}
    stats = json.loads(cli("cache", "stats", "--json", "--store-path", str(tmp_path / "imported"), cwd=tmp_path).stdout)
    assert stats["entries"] == 6 and stats["failure_records"] == 3
    text = cli("cache", "stats", "--store-path", str(tmp_path / "imported"), cwd=tmp_path).stdout
    assert "failure records: 3" in text


def test_a_frozen_answer_takes_the_canonical_key_from_a_frozen_failure(tmp_path: Path) -> None:
    folder = tmp_path / "t" / "Data" / "flaky_for_Data"
    folder.mkdir(parents=True)
    (folder / "lookup.json").write_text(json.dumps({"{'a': 1, 'b': 2}": UPSTREAM_FAILED, "{'b': 2, 'a': 1}": {"error": "", "response": "ok"}}))
    frozen = FrozenCache(tmp_path / "t")
    canonical = canonical_from_upstream_key("{'a': 1, 'b': 2}")
    assert frozen.get_canonical(NS, canonical).answer == {"error": "", "response": "ok"}  # type: ignore[union-attr]
    assert frozen.get(NS, "{'a': 1, 'b': 2}").is_failure  # type: ignore[union-attr]


# -- over real HTTP: a scripted simulator that fails for a fixed subset of calls ----------------

import re  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import requests  # noqa: E402

from stabletoolbench_mirror.factory import build_layer  # noqa: E402
from tests.helpers.openai_stub import OpenAIStub, Reply  # noqa: E402
from tests.helpers.payloads import answer_payload  # noqa: E402

CALLS = 16
UNPARSABLE = {2, 5, 9}  # MirrorAPI's non-JSON output: served "Failed to generate fake response"
ERROR_TEXT = {12}  # a parsed answer the validity rules reject (issue 10 item 10)
FAILING = UNPARSABLE | ERROR_TEXT
API_NS = "Data/flaky_for_Data/lookup"


def call(n: int) -> dict[str, Any]:
    return {"category": "Data", "tool_name": "Flaky", "api_name": "lookup", "tool_input": json.dumps({"n": n}), "strip": "", "toolbench_key": ""}


class ScriptedSimulator:
    """Answers call n with a valid answer, except for the failing subset while ``broken``."""

    def __init__(self) -> None:
        self.broken = True
        self.asked: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        n = int(re.findall(r"'n': (\d+)", body["messages"][-1]["content"])[-1])
        with self._lock:
            self.asked.append(n)
        if self.broken and n in UNPARSABLE:
            return Reply(content="Sure! The lookup found several things, I think.")
        if self.broken and n in ERROR_TEXT:
            return Reply(content=json.dumps({"error": "Rate limit exceeded", "response": ""}))
        return Reply(content=json.dumps({"error": "", "response": f"value of {n}"}))


@pytest.fixture
def simulator():
    script = ScriptedSimulator()
    with OpenAIStub(script) as stub:
        yield script, stub


def record_settings(settings_factory, stub: OpenAIStub, **extra: Any):
    sim = {"enabled": True, "api_base": stub.api_base, "max_retries": 0, "read_timeout_s": 10}
    return settings_factory(simulator=sim, **extra)


def run(server, calls=range(CALLS)) -> dict[int, bytes]:
    session = requests.Session()
    out = {}
    for n in calls:
        r = session.post(server.url + "/virtual", json=call(n), timeout=30)
        assert r.status_code == 200, r.text
        out[n] = r.content
    return out


def server_stats(server) -> dict[str, Any]:
    return requests.get(server.url + "/stats", timeout=10).json()


def test_record_snapshot_replay_every_observation_identical_failures_included(simulator, serve, settings_factory, tmp_path: Path) -> None:
    script, stub = simulator
    recorder = serve(record_settings(settings_factory, stub))
    first = run(recorder)
    assert json.loads(first[2]) == {"error": "Failed to generate fake response", "response": ""}
    assert json.loads(first[12]) == {"error": "Rate limit exceeded", "response": ""}  # served as the model wrote it
    assert json.loads(first[0]) == {"error": "", "response": "value of 0"}
    s = server_stats(recorder)
    assert (s["misses"], s["recorded"], s["failed"], s["failure_records"]) == (CALLS, CALLS - len(FAILING), len(FAILING), len(FAILING))
    with DiskcacheStore(tmp_path / "store") as store:
        failures = {r.key: r for r in store if r.is_failure}
    assert set(failures) == {f"{{'n': {n}}}" for n in FAILING}
    assert failures["{'n': 2}"].reason == "simulated: simulator output not parsable" and failures["{'n': 2}"].tried == ("simulated:MirrorAPI",)
    assert "invalid simulated answer" in failures["{'n': 12}"].reason

    snap = tmp_path / "snap"
    result = cli("snapshot", str(snap), "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((snap / "manifest.json").read_text())["failures"] == len(FAILING)

    # a replay server from the snapshot alone (a fresh, empty store): every observation identical
    replayer = serve(settings_factory(mode="replay", frozen_caches=[str(snap)], store={"kind": "diskcache", "path": str(tmp_path / "empty")}))
    asked = len(script.asked)
    assert run(replayer) == first
    assert len(script.asked) == asked  # replay asks nobody
    s = server_stats(replayer)
    assert s["hits"] == CALLS and s["failure_hits"] == len(FAILING) and s["misses"] == 0

    # check reports identical answers and identical failures apart
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps({"payload": call(n), "observed": json.loads(first[n])}) + "\n" for n in range(CALLS)))
    report = tmp_path / "report.json"
    checked = cli("check", "--calls", str(calls), "--url", replayer.url, "--json", str(report), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"identical: {CALLS - len(FAILING)} answers, {len(FAILING)} failures" in checked.stdout
    assert json.loads(report.read_text())["totals"] == {"identical": CALLS, "identical_failure": len(FAILING), "different": 0, "miss": 0}

    # and --exclude-failures leaves exactly the failing calls out
    clean = tmp_path / "clean"
    assert cli("snapshot", str(clean), "--exclude-failures", "--store-path", str(tmp_path / "store"), "-q", cwd=tmp_path).returncode == 0
    assert set(tree(clean)[API_NS]) == {f"{{'n': {n}}}" for n in range(CALLS) if n not in FAILING}


def test_retry_false_serves_failures_unchanged_retry_true_replaces_them(simulator, serve, settings_factory, tmp_path: Path) -> None:
    script, stub = simulator
    first = run(serve(record_settings(settings_factory, stub)))
    script.broken = False  # the simulator works now
    asked = len(script.asked)

    kept = serve(record_settings(settings_factory, stub, record={"retry_failures": False}))
    assert run(kept) == first
    assert len(script.asked) == asked
    assert server_stats(kept)["retries"] == 0

    retrying = serve(record_settings(settings_factory, stub))
    second = run(retrying)
    assert sorted(script.asked[asked:]) == sorted(FAILING)  # only the failures were asked again, once each
    for n in range(CALLS):
        assert json.loads(second[n]) == {"error": "", "response": f"value of {n}"}
        if n not in FAILING:
            assert second[n] == first[n]
    s = server_stats(retrying)
    assert (s["retries"], s["replaced"], s["hits"], s["failed"]) == (len(FAILING), len(FAILING), CALLS - len(FAILING), 0)
    assert run(retrying) == second  # now hits
    with DiskcacheStore(tmp_path / "store") as store:
        replaced = {r.key: r for r in store if r.replaced is not None}
        assert not any(r.is_failure for r in store)
    assert set(replaced) == {f"{{'n': {n}}}" for n in FAILING}
    kept_provenance = replaced["{'n': 2}"].replaced
    assert kept_provenance["body"] == first[2].decode() and kept_provenance["reason"] == "simulated: simulator output not parsable"
    stats = json.loads(cli("cache", "stats", "--json", "--store-path", str(tmp_path / "store"), cwd=tmp_path).stdout)
    assert stats["failure_records"] == 0 and stats["replaced_failures"] == len(FAILING)


def test_a_retry_that_fails_again_serves_the_recorded_failure(simulator, serve, settings_factory, tmp_path: Path) -> None:
    script, stub = simulator
    first = run(serve(record_settings(settings_factory, stub)), FAILING)
    again = serve(record_settings(settings_factory, stub))
    assert run(again, FAILING) == first
    s = server_stats(again)
    assert (s["retries"], s["failed"], s["replaced"], s["failure_records"]) == (len(FAILING), len(FAILING), 0, 0)


def test_a_failure_never_hides_a_usable_answer_for_the_same_call(simulator, serve, settings_factory, tmp_path: Path) -> None:
    """Exact vs canonical keys and frozen tiers: a failure record loses to any usable answer for the call."""
    script, stub = simulator
    spelled = {"category": "Data", "tool_name": "Flaky", "api_name": "lookup", "tool_input": '{"n": 2, "k": 1}'}
    other = dict(spelled, tool_input='{"k": 1, "n": 2}')  # the same call (canonical key), another upstream key
    spaced = dict(spelled, tool_input='{ "k" : 1 , "n" : 2 }')  # the same upstream key as `other`
    typed = dict(spelled, tool_input='{"n": 2, "k": 1.0}')  # another call: types matter
    failed = serve(record_settings(settings_factory, stub)).post(spelled).json()
    assert failed["error"] == "Failed to generate fake response"
    script.broken = False
    # retries off: the other spelling finds the failure by its canonical key and gets it as recorded
    assert serve(record_settings(settings_factory, stub, record={"retry_failures": False})).post(other).json() == failed
    # retries on: it is tried again; its answer is recorded under its own key and takes the canonical key
    good = serve(record_settings(settings_factory, stub)).post(other).json()
    assert good == {"error": "", "response": "value of 2"}
    with DiskcacheStore(tmp_path / "store") as store:
        assert store.get(API_NS, "{'n': 2, 'k': 1}").is_failure  # type: ignore[union-attr]
    # from now on no spelling of the call is answered with the failure, not even its own exact key
    replayer = serve(settings_factory(mode="replay"))
    for body in (spelled, other, spaced):
        assert replayer.post(body).json() == good
    assert replayer.post(typed).json()["error"] == "API not working error..."  # a miss, not another call's answer
    in_process = build_layer(settings_factory(mode="replay"))  # the blocking path (check, warm) keeps the same rule
    try:
        assert answer_payload(in_process, spelled).answer == good and in_process.settled(in_process.prepare(spelled))
    finally:
        in_process.close()
    assert requests.get(replayer.url + "/stats", timeout=10).json()["failure_hits"] == 0

    # a frozen tier's usable answer wins over a failure record in the store for the same key
    script.broken = True
    second_store = {"kind": "diskcache", "path": str(tmp_path / "store2")}
    assert serve(record_settings(settings_factory, stub, store=second_store)).post(spelled).json() == failed
    frozen = tmp_path / "frozen" / "Data" / "flaky_for_Data"
    frozen.mkdir(parents=True)
    (frozen / "lookup.json").write_text(json.dumps({"{'n': 2, 'k': 1}": {"error": "", "response": "frozen answer"}}))
    with_frozen = serve(settings_factory(mode="replay", store=second_store, frozen_caches=[str(tmp_path / "frozen")]))
    assert with_frozen.post(spelled).json() == {"error": "", "response": "frozen answer"}
    assert serve(settings_factory(mode="replay", store=second_store)).post(spelled).json() == failed


def test_a_session_trajectory_with_a_failure_replays_identically(simulator, serve, settings_factory, tmp_path: Path) -> None:
    """A failure in a session is not part of its history when recorded, nor when replayed: later keys agree."""
    script, stub = simulator
    sim = {"enabled": True, "style": "gpt-fewshot", "api_base": stub.api_base, "max_retries": 0, "parse_retries": 0}
    recorder = serve(settings_factory(simulator=sim))
    trajectory = [call(1), call(2), call(3)]  # 2 fails (unparsable)

    def run_session(server) -> list[bytes]:
        sid = requests.post(server.url + "/sessions", json={"task": "t"}, timeout=10).json()["id"]
        return [requests.post(server.url + "/virtual", json=p, headers={"X-STM-Session": sid}, timeout=30).content for p in trajectory]

    first = run_session(recorder)
    assert json.loads(first[1])["error"] == "Failed to generate fake response"
    replayer = serve(settings_factory(mode="replay"))
    assert run_session(replayer) == first
