"""The page of a score bundle (``report BUNDLE``) and of two bundles side by side (``report A B``); :func:`render`
draws any single source's page.

Drawn with :mod:`.page`'s charts and tables, as self-contained as the run report's page.  The bundle's
page leads with what a paper cites: the score, the environment's hashes and the seal's state (a bundle
changed since its seal is said in red, each changed file named); then the agent's and the judge's
calls, the tool answers and the settings that shaped them.  The per-query labels are summarised (the
JSON has each query's).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from stabletoolbench_mirror.reporting.page import (
    NOT_RECORDED,
    bar_chart,
    colour,
    esc,
    failures_and_faults,
    mcp_section,
    models_section,
    name,
    number,
    page,
    records_part,
    render_run,
    table,
)
from stabletoolbench_mirror.scoring.score import SOLVED, UNSURE

#: changed files, queries and APIs listed on a page at most (the JSON has them all)
LISTED = 200
NO_COMMIT = f"{NOT_RECORDED} (the checkout was not a git clone)"


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _signed(value: Any) -> str:
    return "-" if value is None else f"{value:+.1f} pt"


def _problems(problems: list[str], element_id: str = "problems") -> str:
    if not problems:
        return ""
    items = "".join(f"<li>{esc(p)}</li>" for p in problems[:LISTED])
    more = f"<li>... and {len(problems) - LISTED:,} more (the JSON lists them all)</li>" if len(problems) > LISTED else ""
    return (f'<div class="alert" id="{element_id}"><b>This bundle is not as it was sealed, or does not agree with itself.</b> '
            f"Do not cite its numbers before you know why:<ul>{items}{more}</ul></div>")


def _cite(report: dict[str, Any]) -> str:
    bundle, env = report["bundle"], report["environment"]
    stb = bundle.get("stabletoolbench") or {}
    commit = stb.get("commit") if isinstance(stb, dict) else None
    dirty = " (with local changes)" if isinstance(stb, dict) and stb.get("dirty") else ""
    seal = ('<p class="ok" id="seal-ok">Sealed: every file is as it was when the bundle was sealed.</p>' if bundle["sealed"] else "")
    return (
        '<div class="cite"><b>Environment</b>: records content hash '
        f'<span class="hash" id="records-hash">{esc(env["records_hash"] or "(no records)")}</span><br>'
        f'Bundle content hash <span class="hash" id="bundle-hash">{esc(env["bundle_hash"])}</span>, sealed '
        f"{esc(bundle.get('sealed_at'))} by stabletoolbench-mirror {esc(bundle.get('mirror_version'))}.<br>"
        f'StableToolBench commit <span class="hash" id="stb-commit">{esc(commit or NO_COMMIT)}</span>{esc(dirty)}.<br>'
        "The records hold every answer the run was served (tool answers from every tier, frozen caches included, and the "
        "agent's and the judge's model calls), so their hash names the whole environment; the bundle's hash names the run "
        "too: its answers, labels and score. <code>stabletoolbench-mirror report BUNDLE</code> checks both.</div>" + seal
    )


def _verification(report: dict[str, Any]) -> str:
    """Whether the bundle was replayed: ``verified`` only for a replay's own bundle whose every file was identical."""
    verification = report["bundle"]["verification"]
    if verification["verified"]:
        return (f'<p class="ok" id="verification"><b>Verified</b>: this is the bundle of a {esc(verification["kind"])} of bundle '
                f'<span class="hash">{esc(verification["replayed"])}</span>, which gave every file identical, and its score is what '
                "its label files give. A verdict is what the machine that ran it found: replay it yourself to know.</p>")
    if verification["replayed"] is None:
        return ('<p class="note" id="verification"><b>As published, not replayed</b>: its numbers are what its author\'s run '
                "wrote. <code>stabletoolbench-mirror score --replay BUNDLE --out REPLAYED</code> runs it again from its records "
                "and exits 0 only when every file is identical; <code>report REPLAYED</code> then says verified.</p>")
    return f'<p class="alert" id="verification"><b>{esc(verification["status"])}</b>: of bundle {esc(verification["replayed"])}.</p>'


def _score_section(report: dict[str, Any]) -> str:
    score = report["score"]
    out = ["<h2>Score</h2>"]
    if not score["evaluated"]:
        out.append('<p id="score-none"><b>Not evaluated</b>: the bundle has no <code>score.json</code> (the run stopped before '
                   "its evaluation, or was run without one). No score is made up here.</p>")
        return "".join(out)
    rates = score["pass_rate"]
    times = score.get("evaluate_times")
    out.append(f'<p>Solvable pass rate (SoPR), average over the groups: <span class="big" id="sopr-average">'
               f"{_percent(score['pass_rate_average'])}</span>"
               f"{f', each answer judged {times} times' if times else ''}.</p>")
    out.append(bar_chart("chart-sopr", "SoPR per group, percent", [(g, float(r["solve_rate"]), colour("recorded")) for g, r in rates.items()],
                         unit="%", decimals=1))
    rows = [(g, _percent(r["solve_rate"]), _percent(r["std"]), ", ".join(f"{v:.1f}" for v in r["per_evaluation"]) or "-",
             r["queries"]) for g, r in rates.items()]
    out.append(table("score", ("group", "SoPR", "std", "per evaluation (%)", "queries"), rows, (False, True, True, False, True)))
    out.append('<p class="note">As StableToolBench\'s <code>eval_pass_rate</code> computes it: per evaluation, Solved 1 and '
               "Unsure 0.5 over the queries; the SoPR is their mean, std their population standard deviation.</p>")
    out.append("<h3>Win rate (SoWR)</h3>")
    if score["win_rate"]:
        wins = [(g, f"{100 * w['win']:.1f}%", f"{100 * w['tie']:.1f}%", f"{100 * w['lose']:.1f}%", w.get("queries") or "-")
                for g, w in score["win_rate"].items()]
        out.append(table("win-rate", ("group", "win", "tie", "lose", "queries"), wins, (False, True, True, True, True)))
        reference = report["bundle"].get("reference") or {}
        out.append(f'<p>Average: <span id="sowr-average">{_percent(None if score["win_rate_average"] is None else 100 * score["win_rate_average"])}'
                   f"</span> against {esc(reference.get('label') if isinstance(reference, dict) else reference)}.</p>")
    else:
        out.append('<p id="win-rate-none">Not evaluated: the run named no reference to compare with.</p>')
    return "".join(out)


def _labels_section(report: dict[str, Any]) -> str:
    labels = report["labels"]
    out = ["<h2>Labels per query</h2>"]
    if not labels:
        out.append('<p id="labels-none">No labels: the bundle holds no label file and no <code>score.json</code>.</p>')
        return "".join(out)
    rows = []
    for group, queries in labels.items():
        counted: Counter[str] = Counter()
        for row in queries.values():
            counted.update(row["evaluations"].values())
        solved = [row["solved"] for row in queries.values()]
        shown = "-" if any(s is None for s in solved) else sum(1 for s in solved if s)
        rows.append((group, len(queries), shown, counted.get(SOLVED, 0), counted.get(UNSURE, 0),
                     sum(counted.values()) - counted.get(SOLVED, 0) - counted.get(UNSURE, 0)))
    out.append(table("labels", ("group", "queries", "solved (majority)", "Solved labels", "Unsure labels", "other labels"), rows,
                     (False, True, True, True, True, True)))
    out.append('<p class="note"><code>-</code>: the bundle has no <code>score.json</code> to say.</p>')
    out.append(_per_query(labels))
    return "".join(out)


def _per_query(labels: dict[str, Any]) -> str:
    """Each query's label of each evaluation, in the evaluations' order, and whether it was solved (the first :data:`LISTED`)."""
    solved = {True: "yes", False: "no", None: NOT_RECORDED}
    rows = [(name(group), qid, ", ".join(row["evaluations"][k].removeprefix("AnswerStatus.") for k in sorted(row["evaluations"], key=_order)),
             solved[row["solved"]]) for group, queries in labels.items() for qid, row in sorted(queries.items(), key=lambda q: _order(q[0]))]
    more = (f'<p class="note">The first {LISTED:,} of {len(rows):,} queries; the JSON (<code>labels</code>) has them all.</p>'
            if len(rows) > LISTED else "")
    return ("<h3>Each query</h3>" + table("labels-per-query", ("group", "query", "label of each evaluation", "solved (majority)"),
                                          rows[:LISTED], (False, False, False, False)) + more)


def _order(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 62, key)


def _shaping(env: dict[str, Any]) -> list[tuple[str, Any]]:
    """The simulator's settings and the frozen caches, each value shown or said to be not recorded."""
    sim, configured = env["simulator"], env["settings"].get("simulator")
    off = "the simulator was off" if isinstance(configured, dict) and configured.get("enabled") is False else NOT_RECORDED
    shaping: list[tuple[str, Any]] = [("simulator model", sim.get("model") or off), ("simulator style", sim.get("style") or off),
                                      ("simulator prompt sha256", sim.get("prompt_sha256") or off)]
    for i, frozen in enumerate(env["frozen_caches"]):
        shown = (", ".join(f"{k} {NOT_RECORDED if v is None else v}" for k, v in frozen.items()) if isinstance(frozen, dict)
                 else str(frozen))
        shaping.append((f"frozen cache {i + 1}", name(shown)))
    return shaping


def _run_section(report: dict[str, Any]) -> str:
    bundle, env = report["bundle"], report["environment"]
    reference = bundle.get("reference")
    facts = [("label", bundle.get("label")), ("groups", ", ".join(bundle.get("groups") or [])), ("method", bundle.get("method")),
             ("backbone", bundle.get("backbone")), ("agent model", bundle.get("agent_model")), ("judge model", bundle.get("judge_model")),
             ("evaluator", bundle.get("evaluator")), ("evaluate_times", bundle.get("evaluate_times")),
             ("limit", "every query" if bundle.get("limit") is None else bundle.get("limit")),
             ("reference", reference.get("label") if isinstance(reference, dict) else (reference or "none"))]
    rows = [(k, NOT_RECORDED if v is None else name(v) if k in ("label", "groups", "reference") else v) for k, v in facts]
    return ("<h2>What was run</h2>" + table("run", ("", ""), rows, (False, False))
            + "<h2>Settings that shaped the answers</h2>" + table("settings", ("", ""), _shaping(env), (False, False))
            + '<p class="note">From <code>run.json</code>\'s <code>environment</code> and the records\' manifest.</p>')


def render(report: dict[str, Any]) -> str:
    """The page of any single source's report: a bundle's here, the others' by :func:`.page.render_run`."""
    if report["source"]["kind"] != "bundle":
        return render_run(report)
    return page(f"stabletoolbench-mirror score report: {report['bundle']['label']}", bundle_sections(report))


def bundle_sections(report: dict[str, Any]) -> list[str]:
    """The parts of a bundle's page."""
    bundle = report["bundle"]
    head = [f"<h1>Score report: {name(bundle['label'])}</h1>",
            f'<p class="meta">Bundle: <code id="source">{name(report["source"]["location"])}</code><br>'
            f"Written {esc(report['created_at'])} by {esc(report['created_by'])}.</p>",
            _problems(report["problems"]), _verification(report), _cite(report)]
    parts = [*head, _score_section(report), _labels_section(report), models_section(report["models"], "bundle")]
    if report["records"] is not None:
        parts += records_part(report["records"], "bundle")
    parts += [mcp_section(report.get("mcp")), failures_and_faults(report), _run_section(report)]
    return parts


# -- two bundles --------------------------------------------------------------------------------------------


def _side(side: str, report: dict[str, Any]) -> tuple[str, ...]:
    bundle, env = report["bundle"], report["environment"]
    state = "sealed" if bundle["sealed"] else "CHANGED since its seal"
    return (side, name(bundle["label"]), name(report["source"]["location"]), env["bundle_hash"], env["records_hash"] or NOT_RECORDED, state)


def _compare_scores(pair: dict[str, Any]) -> str:
    comparison = pair["comparison"]
    rows: list[tuple[Any, ...]] = [(g, _percent(c["solve_rate_a"]), _percent(c["solve_rate_b"]), _signed(c["difference"]), len(c["answers_differ"]),
             len(c["labels_differ"])) for g, c in comparison["groups"].items()]
    average = comparison["average"]
    rows.append(("average", _percent(average["a"]), _percent(average["b"]), _signed(average["difference"]), "", ""))
    return ("<h2>Scores</h2>" + table("compare-score", ("group", "SoPR A", "SoPR B", "B - A", "answers that differ", "labels that differ"),
                                      rows, (False, True, True, True, True, True)))


def _compare_queries(pair: dict[str, Any]) -> str:
    comparison = pair["comparison"]
    answers: list[tuple[str, str, str]] = []
    labels: list[tuple[str, str, str, str]] = []
    for group, c in comparison["groups"].items():
        answers += [(group, q, "answer files differ") for q in c["answers_differ"]]
        answers += [(group, q, "only in A") for q in c["answers_only_a"]] + [(group, q, "only in B") for q in c["answers_only_b"]]
        for d in c["labels_differ"]:
            labels.append((group, d["query_id"], _labels_of(d["a"]), _labels_of(d["b"])))
    out = ["<h2>Answers that differ</h2>"]
    out.append(table("answers-differ", ("group", "query", "how"), answers[:LISTED], (False, False, False)) if answers
               else '<p id="answers-same">Every query\'s answer file is the same, byte for byte.</p>')
    out.append("<h2>Labels that differ</h2>")
    out.append(table("labels-differ", ("group", "query", "A", "B"), labels[:LISTED], (False, False, False, False)) if labels
               else '<p id="labels-same">Every query got the same labels (as a multiset: which evaluation got which label may '
                    "be permuted by the judge's threads).</p>")
    if len(answers) > LISTED or len(labels) > LISTED:
        out.append(f'<p class="note">The first {LISTED} of each are listed; the JSON has them all.</p>')
    return "".join(out)


def _labels_of(row: dict[str, Any] | None) -> str:
    if row is None:
        return "(no labels)"
    counted = Counter(v.removeprefix("AnswerStatus.") for v in row["evaluations"].values())
    solved = {True: "solved", False: "not solved", None: ""}[row.get("solved")]
    return ", ".join(f"{k} ×{n}" for k, n in sorted(counted.items())) + (f" ({solved})" if solved else "")


def _compare_records(pair: dict[str, Any]) -> str:
    records = pair["comparison"]["records"]
    if records["same"]:
        return '<h2>Recorded answers</h2><p id="records-same">The same records content hash: the same answers were served.</p>'
    rows = [(what, len(records[key]["tools"]), len(records[key]["models"]))
            for what, key in (("answers differ", "changed"), ("only in A", "only_a"), ("only in B", "only_b"))]
    named = [(key, api) for key in ("changed", "only_a", "only_b") for part in ("tools", "models") for api in records[key][part]]
    return ("<h2>Recorded answers</h2><p>The records differ (APIs by the answers they hold):</p>"
            + table("records-differ", ("APIs", "tools", "models"), rows, (False, True, True))
            + table("records-apis", ("how", "API"), named[:LISTED], (False, False)))


def render_pair(pair: dict[str, Any]) -> str:
    """The page of two bundles side by side (what :func:`.sources.collect_pair` returns)."""
    a, b = pair["a"], pair["b"]
    same = pair["comparison"]["same"]
    verdict = ('<p class="ok" id="same">The two bundles agree: the same scores, answers, labels and records.</p>' if same else
               '<p class="alert" id="different">The two bundles differ: see below.</p>')
    parts = [f"<h1>Two score bundles: {name(a['bundle']['label'])} and {name(b['bundle']['label'])}</h1>",
             f'<p class="meta">Written {esc(pair["created_at"])} by {esc(pair["created_by"])}.</p>',
             table("sides", ("", "label", "bundle", "bundle hash", "records hash", "seal"), [_side("A", a), _side("B", b)],
                   (False,) * 6),
             _problems([f"A: {p}" for p in a["problems"]] + [f"B: {p}" for p in b["problems"]]), verdict,
             _compare_scores(pair), _compare_queries(pair), _compare_records(pair),
             f'<p class="note">A was run on StableToolBench {esc(_commit(a))}, B on {esc(_commit(b))}; models: A '
             f"{esc(_roles(a))}; B {esc(_roles(b))}. {number(a['models']['calls'])} and {number(b['models']['calls'])} model calls.</p>"]
    return page(f"stabletoolbench-mirror: {a['bundle']['label']} and {b['bundle']['label']}", parts)


def _commit(report: dict[str, Any]) -> str:
    stb = report["bundle"].get("stabletoolbench")
    return str(stb.get("commit") or NO_COMMIT) if isinstance(stb, dict) else NO_COMMIT


def _roles(report: dict[str, Any]) -> str:
    roles = report["models"]["roles"]
    return f"agent {roles.get('agent') or NOT_RECORDED}, judge {roles.get('judge') or NOT_RECORDED}"
