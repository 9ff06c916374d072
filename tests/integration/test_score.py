"""``score``: a StableToolBench run recorded into a sealed bundle, replayed and re-scored from it with no model running.

StableToolBench's own scripts (``../shared/reference/stabletoolbench``: ``qa_pipeline_multithread``,
``convert_to_answer_format``, ``eval_pass_rate``, ``eval_preference``), unmodified, in subprocesses; an agent
and a judge (the judge labelling at random at temperature 0.2, upstream's evaluator) and a simulator, all
OpenAI-compatible servers on 127.0.0.1; the reference's small frozen cache.  One recorded pair of runs (CoT,
then DFS with the CoT run as the reference) is shared by the tests; the model servers are stopped before
any replay.  Skips without ``../shared/reference``.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stabletoolbench_mirror.commands.cli import main as cli
from stabletoolbench_mirror.scoring.bundle import open_bundle, read_bundle, seal, verify
from tests.helpers.model_stubs import AgentStub, JudgeStub, ToolLlamaStub
from tests.helpers.openai_stub import OpenAIStub
from tests.helpers.upstream_pipeline import FROZEN_CACHE, TOOLS_DIR, UPSTREAM, upstream_available
from tests.integration.test_what_a_user_sees import documented_keys

pytestmark = pytest.mark.skipif(not upstream_available(), reason="StableToolBench reference copy not found at ../shared/reference")

AGENT, JUDGE = "gpt-3.5-turbo-16k-0613", "gpt-3.5-turbo-16k"
GROUPS = "G1_instruction,G1_tool"
QUERIES = {"G1_instruction": ["1073", "608"], "G1_tool": ["394", "692"]}  # 1073's tool call is in the frozen cache; the others' simulated
QUERY_IDS = ",".join(q for ids in QUERIES.values() for q in ids)
COT, DFS = "CoT@1", "DFS_woFilter_w2"


def score(*args: str, capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str, str]:
    """``stabletoolbench-mirror score ...`` (in this process): exit status, stdout, stderr."""
    if capsys is not None:
        capsys.readouterr()
    code = cli(["score", "--stabletoolbench", str(UPSTREAM), "--tools", str(TOOLS_DIR), "--stand-ins", "--quiet", *args])
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return code, out, err


def record_config(folder: Path, agent: AgentStub, judge: JudgeStub, simulator: OpenAIStub) -> Path:
    config = {
        "mode": "record", "store": {"path": str(folder / "store")}, "frozen_caches": [str(FROZEN_CACHE)],
        "tools_folder": str(TOOLS_DIR), "log_level": "warning",
        "simulator": {"enabled": True, "style": "gpt-fewshot", "api_base": simulator.api_base, "model": "sim", "temperature": 0},
        "llm": {"upstreams": [{"base_url": agent.api_base, "models": [AGENT]}, {"base_url": judge.api_base, "models": [JUDGE]}]},
    }
    path = folder / "record.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def models_config(folder: Path, agent_url: str, judge_url: str, **extra: Any) -> Path:
    """``folder/c.yml``: a record run's config with the agent's and the judge's model servers (and ``extra`` keys)."""
    config = {"mode": "record", "store": {"path": str(folder / "store")}, **extra, "log_level": "warning",
              "llm": {"upstreams": [{"base_url": agent_url, "models": [AGENT]}, {"base_url": judge_url, "models": [JUDGE]}]}}
    path = folder / "c.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("score")


@pytest.fixture(scope="module")
def recorded(work: Path) -> Iterator[dict[str, Any]]:
    """CoT, then DFS against it (SoWR), both recorded through score; every model server stopped afterwards."""
    with AgentStub() as agent, JudgeStub(seed=7) as judge, OpenAIStub() as simulator:
        config = record_config(work, agent, judge, simulator)
        common = ["--config", str(config), "--groups", GROUPS, "--query-ids", QUERY_IDS, "--agent-model", AGENT, "--evaluate-times", "3"]
        cot = score(*common, "--method", COT, "--label", "cot", "--out", str(work / "cot.tar.gz"))
        dfs = score(*common, "--method", DFS, "--label", "dfs", "--reference", str(work / "cot.tar.gz"), "--out", str(work / "dfs"))
        asked = {"agent": agent.count, "judge": judge.count, "simulator": len(simulator.requests),
                 "temperatures": {b.get("temperature") for b in judge.requests}, "labels": set(judge.labels)}
    assert cot[0] == 0 and dfs[0] == 0
    yield {"cot": work / "cot.tar.gz", "dfs": work / "dfs", "asked": asked}


def unpacked(archive: Path, into: Path) -> Path:
    """A copy of a bundle archive's files in a folder of its own."""
    from stabletoolbench_mirror.scoring.bundle import open_bundle

    root = open_bundle(str(archive), into / "downloads").root
    shutil.copytree(root, into / "bundle")
    (into / "bundle" / ".stm-unpacked.json").unlink(missing_ok=True)
    return into / "bundle"


def test_the_record_runs_wrote_sealed_bundles_of_every_file_and_their_score(recorded: dict[str, Any], work: Path) -> None:
    asked = recorded["asked"]
    assert asked["agent"] > 0 and asked["simulator"] > 0
    assert asked["temperatures"] == {0.2} and asked["labels"] == {"Solved", "Unsolved"}  # the judge answers at random
    dfs = read_bundle(recorded["dfs"])
    assert verify(dfs.root) == []
    assert dfs.groups == ["G1_instruction", "G1_tool"] and dfs.run["method"] == DFS and dfs.run["seed"] == 42
    assert dfs.run["reference"]["label"] == "cot" and dfs.run["reference"]["content_hash"].startswith("sha256:")
    assert dfs.run["stabletoolbench"] == {"commit": None, "dirty": None}  # the reference copy is no git checkout
    assert {c["phase"] for c in dfs.run["commands"]} == {"infer", "convert", "pass_rate", "preference"}
    assert all("$WORK" in " ".join(c["argv"]) for c in dfs.run["commands"])
    for group in dfs.groups:
        assert [p.name for p in dfs.answer_files(group)] == sorted(f"{q}_{DFS}.json" for q in QUERIES[group])
        assert (dfs.root / f"preference/{group}_cot_dfs.json").is_file()
        assert (dfs.root / f"reference/cot/converted/{group}.json").is_file()
    # the records hold every tier that answered: the agent's and the judge's calls, the frozen cache's hit, the simulator's answers
    manifest = json.loads((dfs.records / "manifest.json").read_text())
    assert {"model", "frozen", "simulated"} <= set(manifest["by_source"])
    assert dfs.run["environment"]["records_hash"] == manifest["content_hash"]
    # score.json is what upstream printed: SoPR per group, from the label files
    for group, rate in dfs.score["pass_rate"].items():
        printed = (dfs.root / f"logs/pass_rate.{group}.log").read_text()
        assert f"Solve rate: {rate['solve_rate']:.1f}% Std: {rate['std']:.1f}%" in printed
        # SoWR: upstream's eval_preference fails after writing its .json (see session._preference), before printing it
        votes = json.loads((dfs.root / f"preference/{group}_cot_dfs.json").read_text())
        wins = sum(1 for v in votes.values() if v["dfs"] > v["cot"]) / len(votes)
        assert dfs.score["win_rate"][group]["win"] == wins and dfs.score["win_rate"][group]["queries"] == len(QUERIES[group])
    assert dfs.score["pass_rate_average"] is not None and dfs.score["win_rate_average"] is not None


def test_a_bundle_replays_identically_with_every_model_server_stopped(recorded: dict[str, Any], work: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = score("--replay", str(recorded["dfs"]), "--json", capsys=capsys)
    assert code == 0, err
    report = json.loads(out)
    assert sorted(report) == sorted(documented_keys()["score --json"])
    assert report["identical"] is True and report["kind"] == "replay"
    assert [c["group"] for c in report["comparisons"]] == ["G1_instruction", "G1_tool"]
    for comparison in report["comparisons"]:
        assert comparison["answers_identical"] == comparison["answers"] == 2
        assert set(comparison["files"]) >= {f"pass_rate/dfs/{comparison['group']}_dfs.json", f"preference/{comparison['group']}_cot_dfs.json"}
        assert all(comparison["files"].values())
    assert report["score"]["pass_rate"] == read_bundle(recorded["dfs"]).score["pass_rate"]


def test_a_changed_answer_file_makes_the_replay_fail_naming_it(recorded: dict[str, Any], work: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bundle = unpacked(recorded["cot"], work / "changed")
    changed = bundle / f"answers/G1_tool/394_{COT}.json"
    changed.write_text(changed.read_text().replace("Answer to:", "Answer to :", 1))
    # the seal names it at once
    code, _, err = score("--replay", str(bundle), capsys=capsys)
    assert code == 1 and f"answers/G1_tool/394_{COT}.json: changed since the bundle was sealed" in err
    # sealed again over the change: the replay itself finds the answer file that differs
    seal(bundle)
    code, out, err = score("--replay", str(bundle), "--work", str(work / "changed-replay"), "--out", str(work / "changed-replayed"),
                           capsys=capsys)
    assert code == 1, err
    assert f"differs: answers/G1_tool/394_{COT}.json" in out
    replayed = read_bundle(work / "changed-replayed")  # the replay's own bundle says what it found
    assert replayed.verdict is not None and not replayed.verdict.identical and replayed.verdict.replayed == read_bundle(bundle).content_hash
    assert f"answers/G1_tool/394_{COT}.json" in replayed.verdict.differ
    assert cli(["report", str(replayed.root), "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["bundle"]["verification"]["status"] == "replay, different"
    assert "G1_instruction: answers 2/2 identical, 3/3 evaluation files identical: identical" in out
    assert "G1_tool: answers 1/2 identical, 3/3 evaluation files identical: DIFFERENT" in out
    assert "files differ from the bundle" in out
    # records without the agent's calls: upstream's agent stops at its first model call (exit 3, its log named)
    shutil.rmtree(bundle / "records" / "@model" / AGENT)
    seal(bundle)
    code, _, err = score("--replay", str(bundle), "--work", str(work / "changed-replay-2"), capsys=capsys)
    assert code == 3, err
    assert "inference (qa_pipeline_multithread) exited 86 (it reached pdb.set_trace(): a model call failed; in a replay, a call that was not recorded)" in err
    assert "is not recorded, and in replay mode nothing is asked upstream" in err and "the same command resumes" in err


def test_sowr_rescored_twice_from_the_bundle_gives_identical_preference_files(recorded: dict[str, Any], work: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("rescore1", "rescore2"):
        code, _, err = score("--rescore", str(recorded["dfs"]), "--work", str(work / name), capsys=capsys)
        assert code == 0, err
    for group in ("G1_instruction", "G1_tool"):
        for suffix in ("json", "csv"):
            relative = f"preference/{group}_cot_dfs.{suffix}"
            first, second = (work / "rescore1" / relative).read_bytes(), (work / "rescore2" / relative).read_bytes()
            assert first == second == (recorded["dfs"] / relative).read_bytes()


def test_a_rescore_with_out_writes_its_own_bundle_that_report_calls_verified(recorded: dict[str, Any], work: Path,
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``score --rescore ARCHIVE --work REL --out REL``: a relative work folder made absolute once; the re-score's own bundle
    carries its verdict, ``report`` of it says verified, of the published bundle "as published, not replayed"."""
    monkeypatch.chdir(work)
    code, out, err = score("--rescore", "cot.tar.gz", "--work", "rescore-relative", "--out", "cot-rescored", "--json", capsys=capsys)
    assert code == 0, err
    done = json.loads(out)
    assert done["identical"] is True and done["work"] == str(work / "rescore-relative")
    assert (work / "rescore-relative" / "state.json").is_file() and not (work / "rescore-relative" / "rescore-relative").exists()
    published = open_bundle(str(recorded["cot"]), work / "downloads-again")
    rescored = read_bundle(work / "cot-rescored")
    assert done["out"] == {"path": str(work / "cot-rescored"), "content_hash": rescored.content_hash}
    assert rescored.verdict is not None and rescored.verdict.kind == "rescore" and rescored.verdict.identical
    assert rescored.verdict.replayed == published.content_hash and rescored.score == published.score
    statuses = {}
    for source in ("cot.tar.gz", "cot-rescored"):
        capsys.readouterr()
        assert cli(["report", source, "--json-out", f"{source}.report.json", "-q", "--config", str(work / "record.yml")]) == 0
        said = capsys.readouterr().out
        statuses[source] = json.loads((work / f"{source}.report.json").read_text())["bundle"]["verification"]["status"]
        assert f"verification:  {statuses[source]}" in said
    assert statuses == {"cot.tar.gz": "as published, not replayed", "cot-rescored": "verified"}
    capsys.readouterr()
    assert cli(["report", "cot.tar.gz", "cot-rescored", "--json", "-q", "--config", str(work / "record.yml")]) == 0  # they agree
    said = capsys.readouterr()
    comparison = json.loads(said.out)["comparison"]
    assert comparison["same"] is True and comparison["replay"] == {"replayed": "a", "by": "b", "kind": "rescore", "status": "verified"}
    assert "replay:        B is the rescore of A: verified" in said.err


def test_the_report_of_a_recorded_bundle_shows_its_score_calls_tool_share_and_hashes(recorded: dict[str, Any], tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``report BUNDLE`` of a bundle ``score`` wrote: what a paper cites, in the JSON and on the page (headless chromium)."""
    from tests.helpers.browser import open_page, require_chromium, table_rows

    dfs = read_bundle(recorded["dfs"])
    capsys.readouterr()
    assert cli(["report", str(dfs.root), "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"]["kind"] == "bundle" and report["problems"] == []
    for group, rate in dfs.score["pass_rate"].items():
        assert report["score"]["pass_rate"][group]["solve_rate"] == pytest.approx(rate["solve_rate"])
    assert report["score"]["win_rate"].keys() == dfs.score["win_rate"].keys()
    assert {g: {q: row["evaluations"] for q, row in rows.items()} for g, rows in report["labels"].items()} == \
        {g: {q: row["evaluations"] for q, row in rows.items()} for g, rows in dfs.score["labels"].items()}
    models = {row["model"]: row for row in report["models"]["models"]}
    assert report["models"]["roles"] == {"agent": AGENT, "judge": JUDGE}
    assert models[JUDGE]["calls"] >= 3 * len(QUERY_IDS.split(","))  # --evaluate-times 3 per answer, and the preference calls
    assert all(row["prompt_tokens"] > 0 and row["completion_tokens"] > 0 for row in models.values())
    records = report["records"]
    assert not any(name.startswith("@model") for name in records["by_category"])
    assert 0 < records["simulated"]["share"] < 1 and set(records["by_source"]) >= {"frozen", "simulated"}  # tool answers only
    env = report["environment"]
    assert env["records_hash"] == dfs.run["environment"]["records_hash"] and env["bundle_hash"] == dfs.content_hash
    assert env["simulator"]["prompt_sha256"] and env["simulator"]["style"] == "gpt-fewshot"
    require_chromium()
    page_file = tmp_path / "dfs.html"
    assert cli(["report", str(dfs.root), "--html", str(page_file), "-q"]) == 0
    shown = open_page(page_file, lambda page: {"score": table_rows(page, "score"), "models": table_rows(page, "models"),
                                               "share": page.inner_text("#simulated-share"),
                                               "records_hash": page.inner_text("#records-hash")}).result
    assert [row[0] for row in shown["score"]] == dfs.groups
    assert {row[0] for row in shown["models"]} == {AGENT, JUDGE}
    assert shown["share"] == f"{100 * records['simulated']['share']:.1f}%" and shown["records_hash"] == env["records_hash"]


def test_clear_errors_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "store")}, "llm": {"upstreams": [
        {"base_url": "https://api.example.com/v1", "models": ["gpt-*"], "api_key_env": "STM_TEST_UNSET_JUDGE_KEY"}]}}))
    run = ["--config", str(config), "--groups", "G1_instruction", "--method", COT, "--agent-model", AGENT, "--out", str(tmp_path / "b")]
    # a StableToolBench path one level off
    code = cli(["score", "--stabletoolbench", str(UPSTREAM.parent), "--tools", str(TOOLS_DIR), *run])
    assert code == 2
    assert (f"not a StableToolBench checkout (no toolbench/inference/qa_pipeline.py); {UPSTREAM.resolve()} is one: "
            f"use --stabletoolbench {UPSTREAM.resolve()}") in capsys.readouterr().err
    # a group that does not exist
    code, _, err = score(*run[:3], "G1_instructions", *run[4:], capsys=capsys)
    assert code == 2 and "no group G1_instructions in" in err and "the groups are G1_category, G1_instruction" in err
    # a judge with no key
    code, _, err = score(*run, capsys=capsys)
    assert code == 2 and "with the key in $STM_TEST_UNSET_JUDGE_KEY, which is not set: export STM_TEST_UNSET_JUDGE_KEY=..." in err
    assert not (tmp_path / "b").exists()


def test_without_stand_ins_the_gpu_modules_to_install_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "store")},
                                      "llm": {"upstreams": [{"base_url": "http://127.0.0.1:9/v1", "models": ["*"]}]}}))
    code = cli(["score", "--stabletoolbench", str(UPSTREAM), "--tools", str(TOOLS_DIR), "--config", str(config), "--groups", "G1_instruction",
                "--method", COT, "--agent-model", AGENT, "--out", str(tmp_path / "b"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert re.search(r"upstream's modules import peft, sentence_transformers, torch, transformers at the top: install them \(.* -m pip "
                     r"install peft sentence-transformers torch transformers\), or pass --stand-ins", err), err


def test_ctrl_c_leaves_a_run_the_same_command_resumes_and_a_records_of_model_calls_only_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Interrupted in its evaluation (the judge failing, upstream backing off), the run resumes there: the agent is
    not asked again.  Its one query's tool call is answered by no tier, so its records hold model calls only."""
    import os
    import signal
    import subprocess
    import sys
    import time

    with AgentStub() as agent, JudgeStub(seed=3) as judge:
        config = models_config(tmp_path, agent.api_base, judge.api_base)
        command = [sys.executable, "-m", "stabletoolbench_mirror", "score", "--stabletoolbench", str(UPSTREAM), "--tools", str(TOOLS_DIR),
                   "--stand-ins", "--config", str(config), "--groups", "G1_instruction", "--query-ids", "608", "--method", COT,
                   "--agent-model", AGENT, "--evaluate-times", "2", "--out", str(tmp_path / "run.tar.gz")]
        judge.fail(500)  # upstream's judge retries (backoff, 15 s): time to interrupt it there
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        state = tmp_path / "run.work" / "state.json"
        deadline = time.monotonic() + 120
        while not (state.is_file() and "convert:G1_instruction" in state.read_text() and judge.failed):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "run the same command again to resume" in err
        asked = agent.count
        assert json.loads(state.read_text())["done"] == ["prepare", "infer:G1_instruction", "convert:G1_instruction"]
        judge.recover()
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "resuming: 2 of 3 phases done" in done.stderr
        assert agent.count == asked  # the inference was not run again
        assert json.loads(state.read_text())["attempts"]["pass_rate:G1_instruction"] == 2
    bundle = unpacked(tmp_path / "run.tar.gz", tmp_path / "copy")
    assert json.loads((bundle / "records" / "manifest.json").read_text())["by_source"] == {"model": agent.count + 2}
    code, out, err = score("--replay", str(bundle), capsys=capsys)
    assert code == 0, err
    assert "every file identical" in out


def test_toolllama_vllm_through_v1_completions_records_and_replays_identically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--backbone toolllama_vllm``: upstream's ToolLLaMA client calls ``POST /v1/completions`` (ReAct text); its ids
    for the tool calls come from ``random``, seeded by upstream's pipeline, one query after another."""
    model = "ToolBench/ToolLLaMA-2-7b-v2"
    with ToolLlamaStub() as agent, JudgeStub(seed=5) as judge:
        config = tmp_path / "c.yml"
        config.write_text(yaml.safe_dump({"mode": "record", "store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(FROZEN_CACHE)],
                                          "log_level": "warning",
                                          "llm": {"upstreams": [{"base_url": agent.api_base, "models": ["ToolBench/*"]},
                                                                {"base_url": judge.api_base, "models": [JUDGE]}]}}))
        code, out, err = score("--config", str(config), "--groups", "G1_instruction", "--query-ids", "1073,608", "--method", COT,
                               "--backbone", "toolllama_vllm", "--agent-model", model, "--evaluate-times", "2",
                               "--out", str(tmp_path / "llama"), capsys=capsys)
        assert code == 0, err
        prompts = [b["prompt"] for b in agent.requests]
    assert prompts and all(isinstance(p, str) and p.startswith("System: ") for p in prompts)  # /v1/completions, not chat
    bundle = read_bundle(tmp_path / "llama")
    assert bundle.run["backbone"] == "toolllama_vllm" and bundle.run["pipeline"] == "qa_pipeline_multithread"
    manifest = json.loads((bundle.records / "manifest.json").read_text())
    assert "@model" in manifest["by_category"]
    answer = json.loads(bundle.answer_files("G1_instruction")[0].read_text())
    assert "Action Input:" in json.dumps(answer)
    code, out, err = score("--replay", str(tmp_path / "llama"), capsys=capsys)
    assert code == 0, err
    assert "G1_instruction: answers 2/2 identical, 3/3 evaluation files identical: identical" in out


def test_a_server_named_by_url_records_the_run_into_the_served_store_of_its_config(tmp_path: Path,
                                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from stabletoolbench_mirror.config import load_settings
    from stabletoolbench_mirror.serving.server import create_app, uvicorn_options
    from tests.helpers.live import UvicornThread

    with AgentStub() as agent, JudgeStub(seed=1) as judge:
        data = {"mode": "record", "store": {"path": str(tmp_path / "store")}, "frozen_caches": [str(FROZEN_CACHE)], "log_level": "warning",
                "llm": {"upstreams": [{"base_url": agent.api_base, "models": [AGENT]}, {"base_url": judge.api_base, "models": [JUDGE]}]}}
        unset, config = tmp_path / "unset.yml", tmp_path / "c.yml"
        unset.write_text(yaml.safe_dump(data))
        config.write_text(yaml.safe_dump({**data, "record": {"served_store": str(tmp_path / "served")},
                                          "llm": {**data["llm"], "reuse_answers": False}}))
        settings = load_settings(config, environ={})
        run = ["--groups", "G1_instruction", "--query-ids", "1073", "--method", COT, "--agent-model", AGENT, "--evaluate-times", "1"]
        with UvicornThread(create_app(settings), **uvicorn_options(settings)) as server:
            code, _, err = score("--server", server.url, "--config", str(unset), *run, "--out", str(tmp_path / "b0"), capsys=capsys)
            assert code == 2 and "--server: the server must run with record.served_store set" in err
            reusing = tmp_path / "reusing.yml"
            reusing.write_text(yaml.safe_dump({**data, "record": {"served_store": str(tmp_path / "served")}}))
            code, _, err = score("--server", server.url, "--config", str(reusing), *run, "--out", str(tmp_path / "b0"), capsys=capsys)
            assert code == 2 and "set llm.reuse_answers: false in the --config it runs with, or pass --reuse-model-answers" in err
            code, out, err = score("--server", server.url, "--config", str(config), *run, "--out", str(tmp_path / "b"), capsys=capsys)
            assert code == 0, err
    manifest = json.loads((tmp_path / "b" / "records" / "manifest.json").read_text())
    assert manifest["by_source"]["frozen"] == 1 and manifest["by_source"]["model"] == agent.count + 1  # 1073's call; agent and judge
    assert verify(tmp_path / "b") == []


def test_two_records_of_one_label_on_one_store_draw_their_own_answers_and_both_replay(tmp_path: Path,
                                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The second record run of a label on a store gets model-call runs of its own (occurrences from #1) and its own
    answers (the judge labels at random: the labels differ); both bundles replay.  ``--reuse-model-answers`` asks nothing."""
    with AgentStub() as agent, JudgeStub(seed=2) as judge:
        config = models_config(tmp_path, agent.api_base, judge.api_base, frozen_caches=[str(FROZEN_CACHE)])
        run = ["--config", str(config), "--groups", "G1_instruction", "--query-ids", "1073,608", "--method", COT, "--agent-model", AGENT,
               "--evaluate-times", "3", "--label", "same"]
        asked = []
        for name in ("first", "second"):
            code, _, err = score(*run, "--out", str(tmp_path / name), capsys=capsys)
            assert code == 0, err
            asked.append((agent.count, judge.count))
        code, _, err = score(*run, "--reuse-model-answers", "--out", str(tmp_path / "reused"), capsys=capsys)
        assert code == 0, err
        reused = (agent.count, judge.count)
    first, second, third = (read_bundle(tmp_path / name) for name in ("first", "second", "reused"))
    assert asked[1][0] == 2 * asked[0][0] and asked[1][1] == 2 * asked[0][1]  # the second run asked both again
    assert reused == asked[1]  # reusing what the store holds asks nothing
    assert first.run["run_id"] != second.run["run_id"] and third.run["reuse_model_answers"] is True
    labels = [b.score["labels"]["G1_instruction"] for b in (first, second, third)]
    assert labels[0] != labels[1] and labels[2] == labels[1]  # the store holds the latest run's answers
    for name in ("second", "reused"):
        code, out, err = score("--replay", str(tmp_path / name), capsys=capsys)
        assert code == 0, err
        assert "every file identical" in out
    # the README's form, without repeating --stand-ins: the bundle's run.json says the record run used them
    assert first.run["stand_ins"] is True
    readme = ["score", "--replay", str(tmp_path / "first"), "--stabletoolbench", str(UPSTREAM), "--tools", str(TOOLS_DIR), "--quiet"]
    capsys.readouterr()
    assert cli(readme) == 0, capsys.readouterr().err
    assert "every file identical" in capsys.readouterr().out
    # an explicit flag still wins
    assert cli([*readme, "--no-stand-ins"]) == 2
    assert "or pass --stand-ins" in capsys.readouterr().err


def test_a_dead_judge_or_server_fails_at_once_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The model servers the run needs are probed before any script runs: a judge at a port nobody listens on, one
    that accepts connections and never answers, and a wrong --server port each end the run in seconds (exit 2)."""
    import socket
    import time

    from tests.helpers.live import free_port

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel's backlog) and never answers
    dead = f"http://127.0.0.1:{free_port()}/v1"
    try:
        with AgentStub() as agent:
            for judge_url, cause in ((dead, "connection refused"), (f"http://127.0.0.1:{silent.getsockname()[1]}/v1", "timed out")):
                config = models_config(tmp_path, agent.api_base, judge_url)
                started = time.monotonic()
                code, _, err = score("--config", str(config), "--groups", "G1_instruction", "--query-ids", "1073", "--method", COT,
                                     "--agent-model", AGENT, "--out", str(tmp_path / "b"), capsys=capsys)
                took = time.monotonic() - started
                assert code == 2, err
                assert took < 10, took
                assert f"llm.upstreams[1] ({judge_url}, for the judge '{JUDGE}') does not answer ({cause})" in err, err
                assert "llm.upstreams[0]" not in err  # the agent's answers
                assert not (tmp_path / "b").exists() and not (tmp_path / "b.work").exists()
            # a wrong --server port
            config.write_text(yaml.safe_dump({"mode": "record", "store": {"path": str(tmp_path / "store")}, "log_level": "warning",
                                              "record": {"served_store": str(tmp_path / "served")},
                                              "llm": {"reuse_answers": False, "upstreams": [{"base_url": agent.api_base, "models": ["*"]}]}}))
            server = f"http://127.0.0.1:{free_port()}"
            code, _, err = score("--server", server, "--config", str(config), "--groups", "G1_instruction", "--query-ids", "1073",
                                 "--method", COT, "--agent-model", AGENT, "--out", str(tmp_path / "b"), capsys=capsys)
            assert code == 2 and f"nothing answers at --server {server} (connection refused)" in err, err
    finally:
        silent.close()


def test_a_bundle_rescored_with_another_judge_is_a_new_bundle_beside_the_original(tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--rescore BUNDLE --judge-model M --config C --out NEW``: the recorded answers evaluated by a new judge (asked live,
    the agent never), written as a bundle of its own that names the original; it replays with no model running."""
    other = "gpt-4o-mini-judge"
    with AgentStub() as agent, JudgeStub(seed=4) as judge:
        config = models_config(tmp_path, agent.api_base, judge.api_base, frozen_caches=[str(FROZEN_CACHE)])
        code, _, err = score("--config", str(config), "--groups", "G1_instruction", "--query-ids", "1073,608", "--method", COT,
                             "--agent-model", AGENT, "--evaluate-times", "2", "--out", str(tmp_path / "original"), capsys=capsys)
        assert code == 0, err
    original = read_bundle(tmp_path / "original")
    with JudgeStub(seed=9, model=other) as new_judge:  # only the new judge runs: the agent is never asked
        config2 = tmp_path / "c2.yml"
        config2.write_text(yaml.safe_dump({"mode": "record", "store": {"path": str(tmp_path / "store2")}, "log_level": "warning",
                                           "llm": {"upstreams": [{"base_url": new_judge.api_base, "models": [other]}]}}))
        # the same judge again is refused: --rescore alone re-runs the recorded evaluation
        code, _, err = score("--rescore", str(tmp_path / "original"), "--judge-model", JUDGE, "--config", str(config2),
                             "--out", str(tmp_path / "same"), capsys=capsys)
        assert code == 2 and "is the bundle's judge already" in err
        code, out, err = score("--rescore", str(tmp_path / "original"), "--judge-model", other, "--config", str(config2),
                               "--out", str(tmp_path / "regraded"), capsys=capsys)
        assert code == 0, err
        assert new_judge.count > 0 and {b["model"] for b in new_judge.requests} == {other}
    assert f"re-score of {tmp_path / 'original'} with the judge {other} (recorded with {JUDGE})" in out
    assert f"the original's SoPR {original.score['pass_rate']['G1_instruction']['solve_rate']:.1f}%" in out
    regraded = read_bundle(tmp_path / "regraded")
    assert verify(regraded.root) == [] and verify(original.root) == []
    assert regraded.run["judge_model"] == other and regraded.run["agent_model"] == AGENT
    assert regraded.run["rescored_from"] == {"content_hash": original.content_hash, "label": original.label, "judge_model": JUDGE}
    assert {c["phase"] for c in regraded.run["commands"]} == {"convert", "pass_rate"}
    for answer in original.answer_files("G1_instruction"):  # the original's answers, evaluated
        assert (regraded.root / "answers" / "G1_instruction" / answer.name).read_bytes() == answer.read_bytes()
    manifest = json.loads((regraded.records / "manifest.json").read_text())
    assert manifest["by_category"].keys() == {"@model"} and not (regraded.records / "@model" / AGENT).exists()
    # the new bundle replays (its evaluation: it holds no agent calls) with no model running
    code, out, err = score("--replay", str(tmp_path / "regraded"), capsys=capsys)
    assert code == 0, err
    assert "rescore of" in out and "every file identical" in out
