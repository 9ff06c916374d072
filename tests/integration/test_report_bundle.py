"""``report BUNDLE`` and ``report A B``: the report a paper cites, of score bundles made from real runs.

Each bundle is made by :func:`tests.helpers.bundles.build_bundle`: a real server records the agent's and the
judge's calls (stubs on 127.0.0.1 behind ``llm.upstreams``) and the tool answers (imported ones, and a
simulator stub's), ``snapshot`` freezes them into ``records/``, the label files are written in
``eval_pass_rate``'s format from the judge's answers, and the bundle is sealed.  The judge labels each
evaluation as the test planned, so the score below is worked out by hand.  The pages are opened in
headless chromium (Playwright).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stabletoolbench_mirror.scoring import bundle
from stabletoolbench_mirror.upstream.archives import file_sha256, pack
from tests.helpers.browser import drawn_charts, open_page, require_chromium, table_rows
from tests.helpers.bundles import AGENT_MODEL, JUDGE_MODEL, STABLETOOLBENCH_COMMIT, Built, Query, build_bundle, default_groups
from tests.helpers.live import serve_folder
from tests.helpers.paths import REPO

S, U, N = "AnswerStatus.Solved", "AnswerStatus.Unsolved", "AnswerStatus.Unsure"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def report_json(*sources: str, cwd: Path, expected: int = 0) -> dict[str, Any]:
    done = cli("report", *sources, "--json", "-q", cwd=cwd)
    assert done.returncode == expected, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_bundle(tmp_path_factory.mktemp("bundles") / "run1")


def imported_entries(root: Path) -> int:
    return json.loads((root / "records" / "manifest.json").read_text())["by_source"]["imported"]


# -- one bundle ------------------------------------------------------------------------------------------------


def test_the_report_of_a_bundle_has_its_score_labels_calls_tool_answers_and_hashes(built: Built, tmp_path: Path) -> None:
    report = report_json(str(built.root), cwd=tmp_path)
    assert report["source"]["kind"] == "bundle" and report["problems"] == []
    score = report["score"]
    assert score["evaluated"] and score["evaluate_times"] == 4
    # by hand, from the judge's planned labels (Solved 1, Unsure 0.5, per evaluation over the queries)
    instruction, category = score["pass_rate"]["G1_instruction"], score["pass_rate"]["G1_category"]
    assert instruction["per_evaluation"] == pytest.approx([200 / 3, 150 / 3, 100 / 3, 100 / 3])
    assert instruction["solve_rate"] == pytest.approx(137.5 / 3) and instruction["queries"] == 3
    assert category["per_evaluation"] == pytest.approx([75, 75, 75, 25]) and category["solve_rate"] == pytest.approx(62.5)
    assert category["std"] == pytest.approx(21.650635, abs=1e-5)
    assert score["pass_rate_average"] == pytest.approx((137.5 / 3 + 62.5) / 2)
    assert score["win_rate"] == {} and score["win_rate_average"] is None
    # the labels of every query, as the label files hold them, and whether it was solved
    assert {g: {q: row["evaluations"] for q, row in queries.items()} for g, queries in report["labels"].items()} == built.labels
    assert report["labels"]["G1_instruction"]["3"]["evaluations"] == {"0": S, "1": N, "2": U, "3": U}
    assert {q: row["solved"] for q, row in report["labels"]["G1_instruction"].items()} == {"1": True, "2": False, "3": False}
    # the agent's and the judge's calls, their tokens as the clients were served them
    rows = {row["model"]: row for row in report["models"]["models"]}
    assert report["models"]["roles"] == {"agent": AGENT_MODEL, "judge": JUDGE_MODEL}
    judge, agent = rows[JUDGE_MODEL], rows[AGENT_MODEL]
    assert judge["roles"] == ["judge"] and judge["calls"] == 20 and judge["distinct_requests"] == 5  # 5 queries, 4 evaluations each
    assert agent["roles"] == ["agent"] and agent["calls"] == 10 and agent["distinct_requests"] == 10  # two turns per query
    for model, row in rows.items():
        assert (row["prompt_tokens"], row["completion_tokens"]) == (built.usage[model]["prompt_tokens"], built.usage[model]["completion_tokens"])
        assert row["endpoint"] == "chat_completions"
    # tool answers: no model call among them, and the simulated share is theirs only
    imported = imported_entries(built.root)
    records = report["records"]
    assert records["by_source"] == {"imported": imported, "simulated": built.tool_outcomes["recorded"]} and built.tool_outcomes["recorded"] == 3
    assert records["entries"] == imported + 3
    assert records["simulated"]["share"] == pytest.approx(3 / (imported + 3), abs=1e-6)
    assert not any(name.startswith("@model") for name in [*records["by_category"], *records["by_tool"]])
    # the hashes to cite
    seal = json.loads((built.root / "bundle.json").read_text())
    manifest = json.loads((built.root / "records" / "manifest.json").read_text())
    env = report["environment"]
    assert env["records_hash"] == manifest["content_hash"] and env["bundle_hash"] == seal["content_hash"]
    assert env["simulator"] == {"model": "MirrorAPI", "style": built.simulator_prompt["style"], "prompt_sha256": built.simulator_prompt["sha256"]}
    assert report["bundle"]["sealed"] and report["bundle"]["stabletoolbench"] == {"commit": STABLETOOLBENCH_COMMIT, "dirty": False}
    assert set(report["answers"]["G1_instruction"]) == {"1", "2", "3"}


def test_the_page_of_a_bundle_shows_the_score_calls_tokens_simulated_share_and_hashes(built: Built, tmp_path: Path) -> None:
    require_chromium()
    page_file = tmp_path / "bundle.html"
    done = cli("report", str(built.root), "--html", str(page_file), "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = report_json(str(built.root), cwd=tmp_path)

    def inspect(page: Any) -> dict[str, Any]:
        return {"charts": drawn_charts(page), "score": table_rows(page, "score"), "models": table_rows(page, "models"),
                "average": page.inner_text("#sopr-average"), "share": page.inner_text("#simulated-share"),
                "records_hash": page.inner_text("#records-hash"), "bundle_hash": page.inner_text("#bundle-hash"),
                "commit": page.inner_text("#stb-commit"), "sealed": page.locator("#seal-ok").count(),
                "problems": page.locator("#problems").count(), "labels": table_rows(page, "labels"),
                "by_source": table_rows(page, "by-source"), "win_rate": page.inner_text("#win-rate-none"),
                "verification": page.inner_text("#verification"), "per_query": table_rows(page, "labels-per-query"),
                "by_model": table_rows(page, "by-model"), "text": page.inner_text("body"),
                "source": page.evaluate("""() => { const e = document.getElementById('source'), s = getComputedStyle(e);
                                                   return [s.wordBreak, s.overflowWrap, e.innerHTML]; }""")}

    opened = open_page(page_file, inspect, screenshot=tmp_path / "report-bundle.png")
    print(f"screenshot: {opened.screenshot}")
    shown = opened.result
    assert opened.requests == [opened.url]
    assert shown["average"] == "54.2%"
    assert [row[:3] + row[4:] for row in shown["score"]] == [["G1_instruction", "45.8%", "13.8%", "3"], ["G1_category", "62.5%", "21.7%", "2"]]
    usage = built.usage
    assert {row[0]: row[1:] for row in shown["models"]} == {
        model: [role, "chat_completions", f"{calls}", f"{distinct}", f"{usage[model]['prompt_tokens']:,}", f"{usage[model]['completion_tokens']:,}"]
        for model, role, calls, distinct in ((JUDGE_MODEL, "judge", 20, 5), (AGENT_MODEL, "agent", 10, 10))
    }
    imported = imported_entries(built.root)
    assert shown["share"] == f"{100 * 3 / (imported + 3):.1f}%"
    assert {row[0]: row[1] for row in shown["by_source"]} == {"imported": str(imported), "simulator": "3"}
    assert shown["records_hash"] == report["environment"]["records_hash"] and shown["bundle_hash"] == report["environment"]["bundle_hash"]
    assert shown["commit"] == STABLETOOLBENCH_COMMIT and shown["sealed"] == 1 and shown["problems"] == 0
    assert [row[:3] for row in shown["labels"]] == [["G1_instruction", "3", "1"], ["G1_category", "2", "1"]]
    assert "Not evaluated" in shown["win_rate"]
    assert shown["verification"].startswith("As published, not replayed")
    assert shown["per_query"] == [["G1_instruction", "1", "Solved, Solved, Solved, Solved", "yes"],
                                  ["G1_instruction", "2", "Unsolved, Unsolved, Unsolved, Unsolved", "no"],
                                  ["G1_instruction", "3", "Solved, Unsure, Unsolved, Unsolved", "no"],
                                  ["G1_category", "10", "Solved, Solved, Solved, Unsolved", "yes"],
                                  ["G1_category", "11", "Unsure, Unsure, Unsure, Unsure", "no"]]
    # the simulated answers' model and prompt: the run's simulator (run.json), not "-"
    assert [row[1:4] for row in shown["by_model"]] == [["MirrorAPI", built.simulator_prompt["sha256"], "3"]]
    assert not any(word in shown["text"] for word in ("None", "unknown", "\n-\n", "\t-\n"))
    # a name breaks after _ - . / only, never inside a word
    word_break, overflow_wrap, source_html = shown["source"]
    assert word_break == "normal" and overflow_wrap == "normal" and "-<wbr>" in source_html and "/<wbr>" in source_html
    charts = {chart["id"]: chart for chart in shown["charts"]}
    assert {"chart-sopr", "chart-model-tokens", "chart-by-source"} <= set(charts)
    assert len(charts["chart-sopr"]["bars"]) == 2 and len(charts["chart-model-tokens"]["bars"]) == 2
    assert all(bar["width"] > 0 for chart in charts.values() for bar in chart["bars"])


def test_a_bundle_changed_since_its_seal_is_reported_loudly_naming_each_file(built: Built, tmp_path: Path) -> None:
    changed = tmp_path / "changed"
    shutil.copytree(built.root, changed)
    label_file = changed / "pass_rate" / "stm_agent" / "G1_category_stm_agent.json"
    rows = json.loads(label_file.read_text())
    rows["11"]["is_solved"]["0"] = S
    label_file.write_text(json.dumps(rows, indent=4))
    (changed / "answers" / "G1_category" / "12_CoT@1.json").write_text("{}")
    report = report_json(str(changed), cwd=tmp_path, expected=1)
    assert not report["bundle"]["sealed"]
    assert report["bundle"]["changed"] == [{"path": "answers/G1_category/12_CoT@1.json", "change": "added"},
                                           {"path": "pass_rate/stm_agent/G1_category_stm_agent.json", "change": "changed"}]
    assert any("G1_category_stm_agent.json: changed since the bundle was sealed" in p for p in report["problems"])
    # and the changed label file no longer agrees with score.json
    assert "score.json: labels.G1_category.11.evaluations.0: the bundle says 'AnswerStatus.Unsure', its label files give " \
           "'AnswerStatus.Solved'" in report["problems"]
    page_file = tmp_path / "changed.html"
    done = cli("report", str(changed), "--html", str(page_file), "-q", cwd=tmp_path)
    assert done.returncode == 1 and "PROBLEM:" in done.stdout and "CHANGED since its seal" in done.stdout
    require_chromium()
    opened = open_page(page_file, lambda page: {"alert": page.inner_text("#problems"), "sealed": page.locator("#seal-ok").count()})
    assert "answers/G1_category/12_CoT@1.json: added" in opened.result["alert"] and opened.result["sealed"] == 0


def test_a_score_json_the_label_files_do_not_give_is_a_problem(built: Built, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    shutil.copytree(built.root, wrong)
    score = json.loads((wrong / "score.json").read_text())
    score["pass_rate"]["G1_instruction"]["solve_rate"] = 70.0
    (wrong / "score.json").write_text(json.dumps(score))
    bundle.seal(wrong)  # sealed as it is: the seal cannot say the score is wrong, the label files can
    report = report_json(str(wrong), cwd=tmp_path, expected=1)
    assert report["bundle"]["sealed"]
    assert report["problems"] == ["score.json: pass_rate.G1_instruction.solve_rate: the bundle says 70, its label files give 45.8333"]


def test_records_whose_files_are_not_their_manifest_are_a_problem_even_when_sealed_so(built: Built, tmp_path: Path) -> None:
    changed = tmp_path / "changed-records"
    shutil.copytree(built.root, changed)
    weather = changed / "records" / "Weather" / "demo_weather_for_Weather" / "current_weather.json"
    answers = json.loads(weather.read_text())
    answers[next(iter(answers))] = {"error": "", "response": "another answer"}
    weather.write_text(json.dumps(answers))
    bundle.seal(changed)
    report = report_json(str(changed), cwd=tmp_path, expected=1)
    manifest = json.loads((changed / "records" / "manifest.json").read_text())
    assert report["bundle"]["sealed"] and report["environment"]["records_hash"] != manifest["content_hash"]
    assert report["problems"] == [f"records/: the files' content hash {report['environment']['records_hash']} is not their "
                                  f"manifest's {manifest['content_hash']}",
                                  f"run.json: environment.records_hash {manifest['content_hash']} is not the records' content "
                                  f"hash {report['environment']['records_hash']}"]


def test_a_bundle_without_score_json_is_not_evaluated_and_no_score_is_made_up(tmp_path: Path) -> None:
    built = build_bundle(tmp_path / "unscored", evaluated=False)
    report = report_json(str(built.root), cwd=tmp_path)
    assert report["score"] == {"evaluated": False, "pass_rate": {}, "pass_rate_average": None, "win_rate": {}, "win_rate_average": None,
                               "evaluate_times": 4}
    # the label files are there: their labels are shown as they are, nobody says which query was solved
    assert report["labels"]["G1_category"] == {"10": {"evaluations": {"0": S, "1": S, "2": S, "3": U}, "solved": None},
                                               "11": {"evaluations": {"0": N, "1": N, "2": N, "3": N}, "solved": None}}
    require_chromium()
    page_file = tmp_path / "unscored.html"
    assert cli("report", str(built.root), "--html", str(page_file), "-q", cwd=tmp_path).returncode == 0
    opened = open_page(page_file, lambda page: {"none": page.inner_text("#score-none"), "average": page.locator("#sopr-average").count()})
    assert opened.result["none"].startswith("Not evaluated") and opened.result["average"] == 0


# -- a bundle's archive, and at a URL ----------------------------------------------------------------------


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static HTTP server on 127.0.0.1 serving ``tmp_path / "www"``."""
    folder = tmp_path / "www"
    folder.mkdir()
    with serve_folder(folder) as url:
        yield url, folder


def test_a_bundle_archive_and_its_url_report_as_the_folder_does(built: Built, tmp_path: Path, web: tuple[str, Path]) -> None:
    url, www = web
    archive = www / "run1.tar.gz"
    pack(built.root, archive)
    of_folder = report_json(str(built.root), cwd=tmp_path)
    config = tmp_path / "server_config.yml"
    config.write_text(f"download_dir: {tmp_path / 'downloads'}\n")
    for source in (str(archive), f"{url}/run1.tar.gz#sha256={file_sha256(archive)}"):
        report = report_json(source, "--config", str(config), cwd=tmp_path)
        assert report["source"]["kind"] == "bundle" and report["source"]["location"] == source
        for part in ("score", "labels", "models", "records", "environment", "answers", "problems"):
            assert report[part] == of_folder[part], part
    wrong = cli("report", f"{url}/run1.tar.gz#sha256={'0' * 64}", "--json", "--config", str(config), "-q", cwd=tmp_path)
    assert wrong.returncode == 2 and "does not match the expected" in wrong.stderr and wrong.stdout == ""


# -- two bundles side by side --------------------------------------------------------------------------------


def test_two_bundles_side_by_side_say_where_scores_answers_and_labels_differ(built: Built, tmp_path: Path) -> None:
    groups = default_groups()
    groups["G1_instruction"]["2"] = Query("Bergen", ["Unsolved"] * 4)  # another city: another answer, the same labels
    groups["G1_instruction"]["3"] = Query("Oslo", ["Solved", "Solved", "Unsure", "Unsolved"])  # the same answer, other labels
    other = build_bundle(tmp_path / "run2", groups=groups)
    pair = report_json(str(built.root), str(other.root), cwd=tmp_path, expected=1)
    comparison = pair["comparison"]
    assert not comparison["same"]
    instruction, category = comparison["groups"]["G1_instruction"], comparison["groups"]["G1_category"]
    assert instruction["solve_rate_a"] == pytest.approx(137.5 / 3) and instruction["solve_rate_b"] == pytest.approx(162.5 / 3)
    assert instruction["difference"] == pytest.approx(25 / 3)
    assert instruction["answers_differ"] == ["2"] and instruction["answers_only_a"] == instruction["answers_only_b"] == []
    assert [d["query_id"] for d in instruction["labels_differ"]] == ["3"]
    assert instruction["labels_differ"][0]["b"]["evaluations"] == {"0": S, "1": S, "2": N, "3": U}
    assert category["difference"] == 0 and category["answers_differ"] == [] and category["labels_differ"] == []
    assert comparison["average"]["difference"] == pytest.approx(25 / 6)
    assert not comparison["records"]["same"]
    assert "Weather/demo_weather_for_Weather/current_weather" in comparison["records"]["changed"]["tools"]
    assert comparison["records"]["changed"]["models"]  # the agent's and the judge's answers of query 2 and 3

    require_chromium()
    page_file = tmp_path / "pair.html"
    assert cli("report", str(built.root), str(other.root), "--html", str(page_file), "-q", cwd=tmp_path).returncode == 1

    def inspect(page: Any) -> dict[str, Any]:
        return {"score": table_rows(page, "compare-score"), "answers": table_rows(page, "answers-differ"),
                "labels": table_rows(page, "labels-differ"), "different": page.locator("#different").count()}

    opened = open_page(page_file, inspect, screenshot=tmp_path / "report-pair.png")
    print(f"screenshot: {opened.screenshot}")
    shown = opened.result
    assert opened.requests == [opened.url] and shown["different"] == 1
    assert shown["score"][0] == ["G1_instruction", "45.8%", "54.2%", "+8.3 pt", "1", "1"]
    assert shown["score"][1] == ["G1_category", "62.5%", "62.5%", "+0.0 pt", "0", "0"]
    assert shown["answers"] == [["G1_instruction", "2", "answer files differ"]]
    assert shown["labels"] == [["G1_instruction", "3", "Solved ×1, Unsolved ×2, Unsure ×1 (not solved)",
                                "Solved ×2, Unsolved ×1, Unsure ×1 (not solved)"]]


def test_a_bundle_and_its_copy_agree(built: Built, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(built.root, copy)
    pair = report_json(str(built.root), str(copy), cwd=tmp_path)
    assert pair["comparison"]["same"] and pair["comparison"]["records"]["same"]
    assert all(not g["answers_differ"] and not g["labels_differ"] and g["difference"] == 0 for g in pair["comparison"]["groups"].values())


def test_report_a_b_wants_two_bundles(built: Built, tmp_path: Path) -> None:
    done = cli("report", str(built.root), str(built.root / "records"), "--json", "-q", cwd=tmp_path)
    assert done.returncode == 2 and "a snapshot, not a score bundle" in done.stderr


# -- the store and the snapshot the run recorded -------------------------------------------------------------


def test_the_store_and_the_snapshot_count_model_calls_apart_from_tool_answers(built: Built, tmp_path: Path) -> None:
    store = built.store
    imported = imported_entries(built.root)
    for source in (str(store), str(built.root / "records")):
        report = report_json(source, cwd=tmp_path)
        records, models = report["records"], report["models"]
        assert records["entries"] == imported + 3 and records["by_source"] == {"imported": imported, "simulated": 3}, source
        assert records["simulated"]["share"] == pytest.approx(3 / (imported + 3), abs=1e-6), source
        assert "@model" not in records["by_category"] and records["slowest_apis"] == [] or all(
            not row["api"].startswith("@model") for row in records["slowest_apis"]), source
        rows = {row["model"]: row for row in models["models"]}
        assert rows[JUDGE_MODEL]["calls"] == 20 and rows[AGENT_MODEL]["calls"] == 10, source
        for model in (JUDGE_MODEL, AGENT_MODEL):
            assert rows[model]["prompt_tokens"] == built.usage[model]["prompt_tokens"], source
            assert rows[model]["roles"] == [], source  # a store does not say who called: a bundle's run.json does


# -- what run.json and score.json may say --------------------------------------------------------------------


def test_a_win_rate_against_a_reference_is_shown_with_its_average(built: Built, tmp_path: Path) -> None:
    against = tmp_path / "against"
    shutil.copytree(built.root, against)
    # eval_preference's files: per query the votes for each run (a win, a tie, a loss; two wins)
    votes = {"G1_instruction": {"1": (0, 2), "2": (1, 1), "3": (2, 0)}, "G1_category": {"10": (0, 1), "11": (1, 3)}}
    for group, queries in votes.items():
        path = against / bundle.preference_files("chatgpt_cot", "stm_agent", group)[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({q: {"chatgpt_cot": ref, "stm_agent": ours} for q, (ref, ours) in queries.items()}))
    score = json.loads((against / "score.json").read_text())
    score["win_rate"] = {"G1_instruction": {"win": 1 / 3, "tie": 1 / 3, "lose": 1 / 3, "queries": 3},
                         "G1_category": {"win": 1.0, "tie": 0.0, "lose": 0.0, "queries": 2}}
    score["win_rate_average"] = (1 / 3 + 1.0) / 2
    (against / "score.json").write_text(json.dumps(score))
    run = json.loads((against / "run.json").read_text())
    run["reference"] = {"label": "chatgpt_cot", "content_hash": "sha256:" + "1" * 64}
    (against / "run.json").write_text(json.dumps(run))
    bundle.seal(against)
    report = report_json(str(against), cwd=tmp_path)
    assert report["score"]["win_rate"]["G1_category"] == {"win": 1.0, "tie": 0.0, "lose": 0.0, "queries": 2}
    assert report["score"]["win_rate_average"] == pytest.approx(2 / 3) and report["bundle"]["reference"]["label"] == "chatgpt_cot"
    done = cli("report", str(against), "--json-out", str(tmp_path / "against.json"), "-q", cwd=tmp_path)
    assert done.returncode == 0 and "SoWR:          G1_instruction 33.3%, G1_category 100.0%; average 66.7% (against chatgpt_cot)" in done.stdout
    # a win rate its preference files do not give is a problem, naming the number
    score["win_rate"]["G1_category"]["win"] = 0.5
    (against / "score.json").write_text(json.dumps(score))
    bundle.seal(against)
    assert report_json(str(against), cwd=tmp_path, expected=1)["problems"] == [
        "score.json: win_rate.G1_category.win: the bundle says 0.5, its label files give 1"]
    score["win_rate"]["G1_category"]["win"] = 1.0
    (against / "score.json").write_text(json.dumps(score))
    bundle.seal(against)
    require_chromium()
    page_file = tmp_path / "against.html"
    assert cli("report", str(against), "--html", str(page_file), "-q", cwd=tmp_path).returncode == 0
    opened = open_page(page_file, lambda page: {"rows": table_rows(page, "win-rate"), "average": page.inner_text("#sowr-average"),
                                                 "text": page.inner_text("body")})
    assert opened.result["rows"] == [["G1_instruction", "33.3%", "33.3%", "33.3%", "3"], ["G1_category", "100.0%", "0.0%", "0.0%", "2"]]
    assert opened.result["average"] == "66.7%" and "against chatgpt_cot" in opened.result["text"]


@pytest.mark.parametrize("group", ["../../outside", "a/b", "..", ""])
def test_a_group_that_names_a_path_out_of_the_bundle_is_refused(built: Built, tmp_path: Path, group: str) -> None:
    odd = tmp_path / "odd"
    shutil.copytree(built.root, odd)
    run = json.loads((odd / "run.json").read_text())
    run["groups"] = ["G1_instruction", group]
    (odd / "run.json").write_text(json.dumps(run))
    bundle.seal(odd)
    done = cli("report", str(odd), "--json", "-q", cwd=tmp_path)
    assert done.returncode == 2 and "is not a plain name" in done.stderr and done.stdout == ""


def test_a_score_json_of_another_shape_is_a_clear_error(built: Built, tmp_path: Path) -> None:
    odd = tmp_path / "odd-score"
    shutil.copytree(built.root, odd)
    (odd / "score.json").write_text(json.dumps({"pass_rate": {"G1_instruction": {"solve_rate": "high"}}}))
    bundle.seal(odd)
    done = cli("report", str(odd), "--json", "-q", cwd=tmp_path)
    assert done.returncode == 2 and "score.json: pass_rate.G1_instruction.solve_rate:" in done.stderr and "Traceback" not in done.stderr
