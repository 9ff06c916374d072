"""``stabletoolbench-mirror fidelity`` against real OpenAI-compatible stubs on 127.0.0.1.

The metric values are recomputed here with sacrebleu and rouge-score on the same texts.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest
import sacrebleu
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from stabletoolbench_mirror.commands.cli import main
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.protocol import VirtualRequest
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.fidelity.metrics import JUDGE_SYSTEM_PROMPT, METRICS, Scorer, import_rouge, parse_judge_score
from stabletoolbench_mirror.responders.simulator import prompts as simulator_prompts
from stabletoolbench_mirror.stores import DiskcacheStore
from tests.helpers.openai_stub import OpenAIStub, Reply, letter_embedder

# rouge-score's default tokenizer without stemming (given explicitly: the default path logs through absl,
# which attaches a handler to the root logger bound to whatever stderr is at that moment)
# rouge-score itself (import_rouge only keeps absl's log handler from closing pytest's captured stderr)
rouge_scorer, tokenizers = import_rouge()
ROUGE = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False, tokenizer=tokenizers.DefaultTokenizer(use_stemmer=False))


def text_of(answer: dict[str, Any]) -> str:
    value = answer["response"]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def keys_of(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | set().union(*(keys_of(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys_of(v) for v in value)) if value else set()
    return set()


def parsed(answer: dict[str, Any]) -> tuple[bool, Any]:
    value = answer["response"]
    if not isinstance(value, str):
        return True, value
    try:
        return True, json.loads(value)
    except ValueError:
        return False, None


def expected_scores(reference: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    ref, cand = text_of(reference), text_of(candidate)
    ref_ok, ref_value = parsed(reference)
    cand_ok, cand_value = parsed(candidate)
    if ref_ok or cand_ok:
        a = keys_of(ref_value) if ref_ok else set()
        b = keys_of(cand_value) if cand_ok else set()
        jaccard = len(a & b) / len(a | b) if a | b else float(ref_ok == cand_ok)
    else:
        jaccard = None
    return {
        "exact": float(reference == candidate),
        "json_valid": float(cand_ok),
        "error_agreement": float(bool(reference["error"]) == bool(candidate["error"])),
        "key_jaccard": jaccard,
        "bleu": sacrebleu.sentence_bleu(cand, [ref]).score,
        "rouge_l": ROUGE.score(ref, cand)["rougeL"].fmeasure,
    }


def write_config(tmp_path: Path, **data: Any) -> Path:
    config = tmp_path / "fidelity.yml"
    config.write_text(json.dumps({"store": {"path": str(tmp_path / "store")}, **data}))
    return config


def candidate_for(index: int, reference: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The model output scripted for call ``index`` and the answer the simulator makes of it."""
    text = text_of(reference)
    words = text.split(" ")
    kind = index % 4
    if kind == 0:  # the first half of the real text
        answer = {"error": "", "response": " ".join(words[: max(1, len(words) // 2)])}
    elif kind == 1:  # a JSON body with made-up keys
        answer = {"error": "", "response": json.dumps({"status": "ok", "items": [{"name": "x", "score": 1}]})}
    elif kind == 2:  # an error
        answer = {"error": "Invalid parameter", "response": "the API refused the call"}
    else:  # output that cannot be parsed: the simulator's fallback answer
        return "no json here at all", {"error": "Failed to generate fake response", "response": ""}
    return json.dumps(answer), answer


def test_fidelity_metrics_match_sacrebleu_and_rouge(tmp_path, reference_dir, reference_calls, capsys) -> None:
    calls_file = reference_dir / "calls.jsonl"
    scripted = [candidate_for(i, item["observed"]) for i, item in enumerate(reference_calls)]
    lock = threading.Lock()
    queue = [Reply(content=content) for content, _ in scripted]

    def simulator(body: dict[str, Any]) -> Reply:
        with lock:
            return queue.pop(0)

    judged: list[dict[str, Any]] = []

    def judge(body: dict[str, Any]) -> Reply:
        judged.append(body)
        return Reply(content='{"score": 4}')

    with OpenAIStub(simulator) as sim, OpenAIStub(judge) as judge_stub, OpenAIStub() as embed_stub:
        config = write_config(
            tmp_path,
            tools_folder=str(reference_dir / "toolenv" / "tools"),
            simulator={"enabled": True, "api_base": sim.api_base, "max_retries": 0},
        )
        out, page = tmp_path / "report.json", tmp_path / "report.html"
        code = main(
            ["fidelity", "--config", str(config), "--calls", str(calls_file), "--concurrency", "1", "--quiet",
             "--embeddings-api-base", embed_stub.api_base, "--embeddings-model", "emb",
             "--judge-api-base", judge_stub.api_base, "--judge-model", "judge",
             "--json", str(out), "--html", str(page)]
        )  # fmt: skip
        assert code == 0
        # the candidate is the simulator, asked once per call; the optional metrics one request per call each
        assert sim.count == len(reference_calls) == 16
        assert len(embed_stub.embedding_requests) == 16 and embed_stub.count == 0
        assert judge_stub.count == 16 and len(judge_stub.embedding_requests) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"aggregate", "by_category", "calls"}
    assert set(report["aggregate"]) == {"n", *METRICS}
    rows = report["calls"]
    assert len(rows) == 16
    for i, (row, item, (_content, candidate)) in enumerate(zip(rows, reference_calls, scripted)):
        call = ToolCall.from_request(VirtualRequest.model_validate(item["payload"]))
        assert row["api"] == call.api and row["key"] == call.key
        assert row["reference"] == item["observed"] and row["candidate"] == candidate
        for metric, value in expected_scores(item["observed"], candidate).items():
            assert row[metric] == (None if value is None else pytest.approx(value, abs=1e-9)), (i, metric)
        # embeddings: both response texts in one request; cosine of the vectors the stub returned
        request = embed_stub.embedding_requests[i]
        assert request["model"] == "emb"
        assert request["input"] == [text_of(item["observed"]) or " ", text_of(candidate) or " "]
        a, b = letter_embedder(request["input"][0]), letter_embedder(request["input"][1])
        cos = sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
        assert row["cosine"] == pytest.approx(cos)
        assert row["judge"] == 4.0
        judge_messages = judged[i]["messages"]
        assert judge_messages[0]["content"] == JUDGE_SYSTEM_PROMPT
        assert text_of(item["observed"])[:500] in judge_messages[1]["content"]
        assert text_of(candidate)[:500] in judge_messages[1]["content"]
    aggregate = report["aggregate"]
    assert aggregate["n"] == 16
    for metric in METRICS:
        values = [r[metric] for r in rows if r[metric] is not None]
        assert aggregate[metric] == pytest.approx(sum(values) / len(values))
    assert report["by_category"]["Data"]["n"] == 16
    assert aggregate["judge"] == 4.0 and aggregate["exact"] == 0.0
    # the terminal table, and a self-contained HTML page with one histogram per metric
    table = capsys.readouterr().out
    assert "bleu" in table and "rouge_l" in table and "Data" in table
    html = page.read_text()
    assert html.count("<svg") == len(METRICS)
    assert 'id="histogram-judge"' in html and "3.8 to 4.2: 16" in html  # the 16 judge scores of 4.0, in their range
    # both reports name what was scored: simulator, model, prompt hash, date, the references' hash
    from stabletoolbench_mirror.config import load_settings
    from stabletoolbench_mirror.responders.simulator import system_prompt_for

    scored = report["scored"]
    assert (scored["candidate"], scored["simulator"], scored["model"]) == ("simulator", "mirrorapi-sft", "MirrorAPI")
    assert scored["prompt_sha256"] == system_prompt_for(load_settings(str(config))).sha256
    assert scored["date"][:4].isdigit() and scored["date"].endswith("Z") and len(scored["references_sha256"]) == 64
    assert scored["references"] == [f"calls: {calls_file}"]
    for value in (scored["model"], scored["prompt_sha256"], scored["date"], scored["references_sha256"]):
        assert value in html
    assert not any(tag in html for tag in ("<script", "<link", "src=", "href=", "@import"))  # self-contained
    # nothing was recorded: the simulator is asked directly, never through the cache
    with DiskcacheStore(str(tmp_path / "store")) as store:
        assert len(store) == 0


def test_identical_sets_score_exact_one_and_bleu_100(tmp_path, reference_dir, reference_calls) -> None:
    calls_file = str(reference_dir / "calls.jsonl")
    out = tmp_path / "same.json"
    assert main(["fidelity", "--config", str(write_config(tmp_path)), "--calls", calls_file, "--candidate-calls", calls_file,
                 "--quiet", "--json", str(out)]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    aggregate = report["aggregate"]
    assert aggregate["n"] == len(reference_calls) == 16
    assert aggregate["exact"] == 1.0 and aggregate["error_agreement"] == 1.0
    assert aggregate["bleu"] == pytest.approx(100.0) and aggregate["rouge_l"] == pytest.approx(1.0)
    assert aggregate["key_jaccard"] == pytest.approx(1.0)
    assert aggregate["cosine"] is None and aggregate["judge"] is None
    assert all(r["bleu"] == pytest.approx(100.0) and r["exact"] == 1.0 for r in report["calls"])


def test_the_calls_own_answer_never_reaches_a_few_shot_prompt(tmp_path, reference_dir, reference_calls, monkeypatch) -> None:
    """gpt-fewshot draws examples from the store and frozen caches, which hold the reference answers themselves."""
    monkeypatch.setattr(simulator_prompts, "EXAMPLES_BUDGET_CHARS", 100_000)  # room for every other call of an API
    store_path = tmp_path / "store"
    calls = [ToolCall.from_request(VirtualRequest.model_validate(item["payload"])) for item in reference_calls]
    with DiskcacheStore(str(store_path)) as store:
        for call, item in zip(calls, reference_calls):
            if isinstance(call.tool_input, dict) and len(call.tool_input) > 1:
                # the same input in another key order: another upstream key, the same canonical key
                reordered = dict(reversed(list(call.tool_input.items())))
                store.add(Record.from_answer(call.api, str(reordered), item["observed"], "real"), call.canonical)
    with OpenAIStub() as sim:
        config = write_config(
            tmp_path,
            tools_folder=str(reference_dir / "toolenv" / "tools"),
            frozen_caches=[str(reference_dir / "cache")],
            simulator={"enabled": True, "style": "gpt-fewshot", "api_base": sim.api_base},
        )
        assert main(["fidelity", "--config", str(config), "--calls", str(reference_dir / "calls.jsonl"), "--concurrency", "1", "--quiet"]) == 0
        prompts = [r["messages"][1]["content"] for r in sim.requests]
    assert len(prompts) == 16
    texts = [json.dumps(item["observed"], ensure_ascii=False) for item in reference_calls]
    others_seen = 0
    for call, prompt, own in zip(calls, prompts, texts):
        examples = prompt.split("Earlier calls of this API", 1)[1].split("Input of the new call:", 1)[0]
        assert f"input: {call.key}\n" not in examples
        if texts.count(own) == 1:
            assert own not in examples
        others = {c.key for c in calls if c.api == call.api and c.canonical != call.canonical}
        for key in others:
            assert f"input: {key}\n" in examples  # the other calls of the API are examples: the check above is not vacuous
            others_seen += 1
    assert others_seen > 0


def test_bad_inputs_are_errors_not_crashes(tmp_path, reference_dir, capsys) -> None:
    config = str(write_config(tmp_path))
    assert main(["fidelity", "--config", config]) == 2
    assert main(["fidelity", "--config", config, "--calls", str(reference_dir / "calls.jsonl"), "--shadow"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"payload": {"category": "Data"}, "observed": {"error": "", "response": "x"}}\n'
                   '{"payload": {"category": "D", "tool_name": "t", "api_name": "a", "tool_input": "{"}, "observed": {"error": "", "response": "x"}}\n'
                   '{"payload": {"category": "D", "tool_name": "t", "api_name": "a", "tool_input": "{}"}, "observed": "{\\"error\\": \\"\\", \\"resp..."}\n')  # fmt: skip
    out = tmp_path / "bad.json"
    # nothing scored: an error (exit 1), and the report still lists why
    assert main(["fidelity", "--config", config, "--calls", str(bad), "--candidate-calls", str(bad), "--quiet", "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["aggregate"]["n"] == 0 and report["aggregate"]["bleu"] is None
    assert len(report["problems"]) == 6  # three bad lines, each read as a reference and as a candidate
    (tmp_path / "garbage.jsonl").write_text("not json\n")
    assert main(["fidelity", "--config", config, "--calls", str(tmp_path / "garbage.jsonl"), "--quiet"]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_judge_score_parsing() -> None:
    assert parse_judge_score('{"score": 5}') == 5.0
    assert parse_judge_score("I'd say 3 out of 5") == 3.0
    assert parse_judge_score('{"score": 9}') is None
    assert parse_judge_score("no idea") is None


@given(
    st.lists(st.sampled_from(["a", "b", "c", "d", "Ab", "x1", "é", "-", "  "]), max_size=60).map(" ".join),
    st.lists(st.sampled_from(["a", "b", "c", "d", "ab", "X1", "é", ",", " "]), max_size=60).map(" ".join),
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_rouge_l_equals_rouge_score(reference: str, candidate: str) -> None:
    assert Scorer().rouge_l(reference, candidate) == ROUGE.score(reference, candidate)["rougeL"].fmeasure


def test_answer_files_as_reference(tmp_path, reference_dir, reference_calls) -> None:
    from stabletoolbench_mirror.upstream.answers import observation_text
    from tests.helpers.answer_files import api, dfs_answer, param, query

    artist, info = ("Songkick artist", '{\n  "artist_id": "28003"\n}'), ("Get info about artist", '{\n  "parameter": "Lionel Messi"\n}')
    observed = {(i["payload"]["api_name"], i["payload"]["tool_input"]): i["observed"] for i in reference_calls}
    apis = [
        api("Data", "TheClique", "Songkick artist", required=[param("artist_id", "STRING", "1")]),
        api("Data", "TheClique", "Get info about artist", required=[param("parameter", "STRING", "x")]),
    ]
    queries = tmp_path / "queries.json"
    queries.write_text(json.dumps([query(7, apis)]))
    calls = [
        ("songkick_artist_for_theclique", '{\n  "artist_id": "28003"\n}', observation_text(observed[artist])),
        ("get_info_about_artist_for_theclique", '{\n  "parameter": "Lionel Messi"\n}', observation_text(observed[info], 100)),  # cut
    ]
    answers = tmp_path / "7_DFS_woFilter_w2.json"
    answers.write_text(json.dumps(dfs_answer("q", calls)))
    out = tmp_path / "answers.json"
    code = main(["fidelity", "--config", str(write_config(tmp_path)), "--answers", str(answers), "--queries", str(queries),
                 "--candidate-calls", str(reference_dir / "calls.jsonl"), "--quiet", "--json", str(out)])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    cut = [c for c in calls if c[2].endswith("...")]
    assert len(cut) == 1  # an observation cut at 1,024 characters is no whole answer: listed, not scored
    assert report["aggregate"]["n"] == len(calls) - len(cut)
    assert len(report["problems"]) == len(cut) and all("1,024" in p for p in report["problems"])
    assert report["aggregate"]["n"] >= 1 and report["aggregate"]["exact"] == 1.0


def test_from_store_asks_the_simulator_with_the_live_prompt(tmp_path, reference_dir, reference_calls) -> None:
    from tests.integration.test_prompt_parity import upstream_messages, write_upstream_prompts

    layout = json.loads((reference_dir / "mirrorapi_prompts.json").read_text())
    prompts_file = write_upstream_prompts(tmp_path / "system_prompts.py", layout)
    with DiskcacheStore(str(tmp_path / "store")) as store:
        for item in reference_calls:
            call = ToolCall.from_request(VirtualRequest.model_validate(item["payload"]))
            store.add(Record.from_answer(call.api, call.key, item["observed"], "real", "relay"), call.canonical)
        store.add(Record.from_answer("Data/x_for_Data/y", "{}", {"error": "", "response": "simulated"}, "simulated", "m"), "{}")
        failed = {"error": "API not working error...", "response": ""}
        store.add(Record.failure("Data/x_for_Data/z", "{}", failed, "real", "relay", reason="rate limit"), "{}")
    tools = reference_dir / "toolenv" / "tools"
    with OpenAIStub() as sim:
        config = write_config(tmp_path, tools_folder=str(tools), simulator={"api_base": sim.api_base, "system_prompt_file": str(prompts_file)})
        out = tmp_path / "store.json"
        assert main(["fidelity", "--config", str(config), "--from-store", "--quiet", "--json", str(out)]) == 0
        sent = [json.dumps(r["messages"], ensure_ascii=False) for r in sim.requests]
    assert json.loads(out.read_text())["aggregate"]["n"] == 16  # the real answers only (no failure record)
    live = {json.dumps(upstream_messages(layout, tools, item["payload"], "mirrorapi-sft"), ensure_ascii=False) for item in reference_calls}
    assert len(sent) == 16 and set(sent) == live


# -- issue 18 item 7h: --from-store with no real answers says why and fails -------------------------


def test_from_store_without_real_answers_says_why_and_exits_non_zero(tmp_path, capsys) -> None:
    with DiskcacheStore(str(tmp_path / "store")) as store:
        for i in range(3):
            store.add(Record.from_answer("Data/x_for_Data/y", f"{{'i': {i}}}", {"error": "", "response": "sim"}, "simulated", "m"), None)
        failed = {"error": "API not working error...", "response": ""}
        store.add(Record.failure("Data/x_for_Data/z", "{}", failed, "real", "relay", reason="rate limit"), "{}")
    out = tmp_path / "report.json"
    with OpenAIStub() as sim:
        config = str(write_config(tmp_path, simulator={"api_base": sim.api_base}))
        assert main(["fidelity", "--config", config, "--from-store", "--quiet", "--json", str(out)]) == 1
        assert not sim.requests
    err = capsys.readouterr().err
    assert (f"error: --from-store: nothing to score: the store at {tmp_path / 'store'} holds no real answers "
            "(4 entries: 3 simulated, 1 real failure records). fidelity scores candidates against answers the real API gave: "
            "record some first (real.enabled: true, then serve in record mode or warm), "
            "or give the reference answers with --calls FILE.jsonl or --answers PATH") in err
    assert not out.exists()  # no empty report that reads as a result
    empty = tmp_path / "empty"
    config = str(write_config(empty.parent, store={"path": str(empty)}))
    assert main(["fidelity", "--config", config, "--from-store", "--candidate-calls", str(tmp_path / "none.jsonl"), "--quiet"]) == 1
    assert f"the store at {empty} is empty." in capsys.readouterr().err


# -- issue 18 item 8: a lone surrogate is a listed problem, and the report is written whole or not at all ----


def _fidelity(args: list[str], cwd: Path, preexec: Any = None) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("STM_")}
    return subprocess.run([sys.executable, "-m", "stabletoolbench_mirror", "fidelity", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec)


def _surrogate_calls(tmp_path: Path) -> Path:
    good = {"payload": {"category": "D", "tool_name": "t", "api_name": "a", "tool_input": '{"q": "x"}'},
            "observed": {"error": "", "response": "a real answer"}}
    calls = tmp_path / "calls.jsonl"
    # the second line's observed answer holds "\ud800": valid JSON, but no UTF-8 text can hold it
    bad = json.dumps({**good, "payload": {**good["payload"], "api_name": "b"}, "observed": {"error": "", "response": "x \ud800 y"}})
    calls.write_text(json.dumps(good) + "\n" + bad + "\n")
    assert "\\ud800" in calls.read_text()
    return calls


def test_a_lone_surrogate_in_calls_is_a_listed_problem_not_a_crash(tmp_path: Path) -> None:
    calls = _surrogate_calls(tmp_path)
    out = tmp_path / "report.json"
    out.write_text('{"old": "report"}\n')
    # the simulator's answer holds one too
    with OpenAIStub(lambda body: Reply(content='{"error": "", "response": "sim \\ud800"}')) as sim:
        config = str(write_config(tmp_path, simulator={"api_base": sim.api_base, "allow_without_docs": True}))
        result = _fidelity(["--config", config, "--calls", str(calls), "--quiet", "--json", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert ("calls.jsonl:2: observed contains a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape): fix or drop the line"
            in result.stdout)
    report = json.loads(out.read_text())  # whole, and new
    assert report["aggregate"]["n"] == 1 and len(report["problems"]) == 1
    assert report["calls"][0]["exact"] == 0.0  # the simulator's unusable answer scored as the miss it is
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report.json")] == []


def test_a_report_that_cannot_be_written_leaves_the_old_one(tmp_path: Path) -> None:
    import resource
    import signal

    calls = _surrogate_calls(tmp_path)
    out = tmp_path / "report.json"
    out.write_text('{"old": "report"}\n')

    def small_files() -> None:  # a real write that fails halfway: files may not grow past 300 bytes
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))

    config = str(write_config(tmp_path))
    result = _fidelity(["--config", config, "--calls", str(calls), "--candidate-calls", str(calls), "--quiet", "--json", str(out)],
                       tmp_path, preexec=small_files)
    assert result.returncode == 1 and "error: the report cannot be written: [Errno 27] File too large" in result.stderr, result.stderr
    assert out.read_text() == '{"old": "report"}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report.json")] == []
    missing = _fidelity(["--config", config, "--calls", str(calls), "--quiet", "--json", str(tmp_path / "no" / "r.json")], tmp_path)
    assert missing.returncode == 2 and f"error: --json {tmp_path / 'no' / 'r.json'}: the folder {tmp_path / 'no'} does not exist" in missing.stderr
