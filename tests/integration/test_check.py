"""`check`: replay recorded calls against a served cache or the in-process layer; identical / different / miss."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from stabletoolbench_mirror.checking.replay import LayerTarget, run_check
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.upstream.answers import observation_text
from stabletoolbench_mirror.upstream.expectations import Expectation
from tests.helpers.answer_files import api, cot_answer, dfs_answer, param, query


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def write_config(tmp_path: Path, **data) -> Path:
    data.setdefault("store", {"path": str(tmp_path / "store")})
    path = tmp_path / "check_config.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_reference_calls_against_served_reference_cache_are_identical(reference_dir: Path, serve, settings_factory, tmp_path: Path) -> None:
    server = serve(settings_factory(mode="replay", frozen_caches=[str(reference_dir / "cache")]))
    report = tmp_path / "report.json"
    result = cli("check", "--calls", str(reference_dir / "calls.jsonl"), "--url", server.url, "--json", str(report), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "16 calls: 16 identical (100.0%), 0 different, 0 miss" in result.stdout
    data = json.loads(report.read_text())
    assert data["totals"] == {"identical": 16, "identical_failure": 0, "different": 0, "miss": 0} and data["identical_fraction"] == 1.0
    assert data["per_api"]["Data/theclique_for_Data/songkick_concert"]["identical"] == 3


def test_changed_and_missing_entries_are_reported(reference_dir: Path, serve, settings_factory, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(reference_dir / "cache", cache)
    changed = cache / "Data" / "keyword_analysis_for_Data" / "querykeywords.json"
    entries = json.loads(changed.read_text())
    key = next(iter(entries))
    entries[key]["response"] = entries[key]["response"] + " "
    changed.write_text(json.dumps(entries))
    removed = cache / "Data" / "kick_com_api_kick_api_for_Data" / "get_channel_details.json"
    removed.unlink()
    server = serve(settings_factory(mode="replay", frozen_caches=[str(cache)]))
    report = tmp_path / "report.json"
    result = cli("check", "--calls", str(reference_dir / "calls.jsonl"), "--url", server.url + "/virtual", "--json", str(report), cwd=tmp_path)
    assert result.returncode == 1
    assert "16 calls: 14 identical (87.5%), 1 different, 1 miss" in result.stdout
    data = json.loads(report.read_text())
    assert data["per_api"]["Data/keyword_analysis_for_Data/querykeywords"] == {"identical": 0, "identical_failure": 0, "different": 1, "miss": 0}
    assert data["per_api"]["Data/kick_com_api_kick_api_for_Data/get_channel_details"] == {"identical": 0, "identical_failure": 0, "different": 0, "miss": 1}
    assert {m["verdict"] for m in data["mismatches"]} == {"different", "miss"}
    assert cli("check", "--calls", str(reference_dir / "calls.jsonl"), "--url", server.url, "--report-only", cwd=tmp_path).returncode == 0


def test_in_process_layer_in_replay_mode_records_nothing(reference_dir: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, frozen_caches=[str(reference_dir / "cache")], simulator={"enabled": True, "api_base": "http://127.0.0.1:9/v1"})
    result = cli("check", "--calls", str(reference_dir / "calls.jsonl"), "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "16 identical (100.0%)" in result.stdout
    calls = tmp_path / "more.jsonl"
    payload = {"category": "Data", "tool_name": "Keyword Analysis", "api_name": "QueryKeywords", "tool_input": '{"q": "never seen"}'}
    calls.write_text(json.dumps({"payload": payload, "observed": {"error": "", "response": "x"}}) + "\n")
    result = cli("check", "--calls", str(calls), "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1 and "1 miss" in result.stdout
    assert not (tmp_path / "store").exists() or "entries: 0" in cli("cache", "stats", "--config", str(config), cwd=tmp_path).stdout


def test_answer_files_against_served_cache(reference_dir: Path, serve, settings_factory, tmp_path: Path) -> None:
    reference = {}
    for line in (reference_dir / "calls.jsonl").read_text().splitlines():
        item = json.loads(line)
        reference[(item["payload"]["api_name"], item["payload"]["tool_input"])] = item["observed"]
    search = reference[("Transfermarkt search", '{\n  "name": "Lionel Messi"\n}')]
    artist = reference[("Songkick artist", '{\n  "artist_id": "28003"\n}')]
    queries = tmp_path / "queries.json"
    apis = [
        api("Data", "TheClique", "Transfermarkt search", required=[param("name", "STRING", "messi")]),
        api("Data", "TheClique", "Songkick artist", required=[param("artist_id", "STRING", "520117-arctic-monkeys")]),
    ]
    queries.write_text(json.dumps([query(588, apis)]))
    answers = tmp_path / "answers"
    answers.mkdir()
    good = [
        ("transfermarkt_search_for_theclique", '{\n  "name": "Lionel Messi"\n}', observation_text(search)),
        ("songkick_artist_for_theclique", '{\n  "artist_id": "28003"\n}', observation_text(artist)),
    ]
    (answers / "588_DFS_woFilter_w2.json").write_text(json.dumps(dfs_answer("q", good)))
    wrong = [("songkick_artist_for_theclique", '{\n  "artist_id": "28003"\n}', '{"error": "", "response": "something else"}')]
    (answers / "588_CoT@1.json").write_text(json.dumps(cot_answer("q", wrong)))
    server = serve(settings_factory(mode="replay", frozen_caches=[str(reference_dir / "cache")]))
    result = cli("check", "--answers", str(answers / "588_DFS_woFilter_w2.json"), "--queries", str(queries), "--url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 calls: 2 identical (100.0%)" in result.stdout
    result = cli("check", "--answers", str(answers), "--queries", str(queries), "--url", server.url, cwd=tmp_path)
    assert result.returncode == 1 and "3 calls: 2 identical" in result.stdout and "1 different" in result.stdout
    missing_index = cli("check", "--answers", str(answers), "--url", server.url, cwd=tmp_path)
    assert missing_index.returncode == 2 and "--queries" in missing_index.stderr


def test_observation_texts_compare_after_the_clients_cut(settings_factory, tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "Data" / "t_for_Data"
    tree.mkdir(parents=True)
    long_answer = {"error": "", "response": "z" * 3000}
    (tree / "api.json").write_text(json.dumps({"{'a': 1}": long_answer}))
    layer = build_layer(settings_factory(mode="replay", frozen_caches=[str(tmp_path / "tree")]))
    payload = {"category": "Data", "tool_name": "t", "api_name": "api", "tool_input": '{"a": 1}'}
    expectations = [
        Expectation(payload, observation_text(long_answer), "cut", text=True),
        Expectation(payload, observation_text(long_answer, 100), "shorter cut", text=True),
        Expectation(payload, long_answer, "object"),
        Expectation(dict(payload, tool_input="{bad"), {"error": "Tool input parse error...\n", "response": ""}, "parse error"),
    ]
    report = run_check(expectations, LayerTarget(layer))
    assert report.totals["identical"] == 3 and report.totals["different"] == 1
    assert report.totals["identical_failure"] == 0  # upstream's parse error answer is an answer, not a failure
    assert report.mismatches[0].location == "shorter cut"


def test_bad_calls_file_is_a_clear_error(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"payload": {}}\n')
    result = cli("check", "--calls", str(calls), cwd=tmp_path)
    assert result.returncode == 2 and "calls.jsonl:1" in result.stderr
    calls.write_text("not json\n")
    assert "not JSON" in cli("check", "--calls", str(calls), cwd=tmp_path).stderr
    assert cli("check", cwd=tmp_path).returncode == 2


def test_a_url_that_is_not_http_is_a_clear_error(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_text("")
    result = cli("check", "--calls", str(calls), "--url", "ftp://127.0.0.1:1", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: --url must be http://HOST:PORT or https://HOST:PORT (got 'ftp://127.0.0.1:1')" in result.stderr
