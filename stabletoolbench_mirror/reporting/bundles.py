"""A score bundle's report (``report BUNDLE``): the score, the agent's and the judge's calls, the environment.

What is read (see :mod:`stabletoolbench_mirror.scoring.bundle` for the layout):

* the seal (``bundle.json``), checked with :func:`~stabletoolbench_mirror.scoring.bundle.verify`: a file
  added, removed or changed since is a problem named in the report (and exit status 1), never hidden;
* ``run.json``: what was run (label, groups, method, agent and judge models, evaluator,
  ``evaluate_times``, StableToolBench's commit) and the settings that shape answers (``environment``);
* ``score.json``: SoPR per group and on average, SoWR when a reference was named, the labels per query.
  Absent, the bundle is *not evaluated*: no score is made up.  Present, each group's solve rate is
  recomputed from ``eval_pass_rate``'s label file with :func:`~stabletoolbench_mirror.scoring.score.pass_rate`
  and a disagreement is a problem;
* ``records/``: the snapshot of every answer the run was served.  Its content hash (recomputed from its
  files) is the environment's hash: it covers the answers of every tier that answered, the frozen
  caches' included, because the records hold every answer served.  Its tool answers and its model
  calls are counted apart (:mod:`.tally`); a model call is the agent's or the judge's by its model;
* the answer files: one SHA-256 per query, so that two bundles' answers can be compared (:func:`compare`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabletoolbench_mirror.core.model_calls import model_endpoint
from stabletoolbench_mirror.reporting.tally import ReportError, snapshot_tallies
from stabletoolbench_mirror.scoring.assemble import score_differences
from stabletoolbench_mirror.scoring.bundle import BUNDLE_FILE, Bundle, BundleError, read_bundle, verify
from stabletoolbench_mirror.scoring.contents import ContentsError, ScoreFile, read_json
from stabletoolbench_mirror.upstream.archives import MARKER, ArchiveError, file_sha256, tree_hash
from stabletoolbench_mirror.upstream.failures import MANIFEST_NAME

#: the run's facts a report repeats (``run.json``)
RUN_FACTS = ("label", "groups", "method", "backbone", "agent_model", "judge_model", "evaluator", "evaluate_times", "limit",
             "reference", "stabletoolbench")


def is_bundle(folder: str | Path) -> bool:
    return Path(folder, BUNDLE_FILE).is_file()


def query_id(answer_file: Path) -> str:
    """The query of ``<query_id>_<method>.json`` (``qa_pipeline``'s answer file name)."""
    return answer_file.name.split("_", 1)[0]


# -- the parts --------------------------------------------------------------------------------------------


def _score(bundle: Bundle) -> dict[str, Any]:
    if not (bundle.root / "score.json").is_file():
        return {"evaluated": False, "pass_rate": {}, "pass_rate_average": None, "win_rate": {}, "win_rate_average": None}
    score = ScoreFile.model_validate(bundle.score)  # checked by read_bundle (scoring/contents.py)
    return {"evaluated": True, **score.model_dump(include=set(ScoreFile.model_fields) - {"labels"})}


def _json(path: Path) -> Any:
    """A file of the bundle, read bounded (scoring/contents.py)."""
    try:
        return read_json(path)
    except (OSError, ContentsError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None


def _label_file(bundle: Bundle, group: str) -> dict[str, dict[str, str]] | None:
    """``{query_id: {evaluate_time: label}}`` of ``eval_pass_rate``'s label file of ``group`` (``None``: no such file)."""
    files = [p for p in bundle.label_files(group) if p.suffix == ".json"]
    if not files:
        return None
    data = _json(files[0])
    if not isinstance(data, dict):
        raise ReportError(f"{files[0]}: not eval_pass_rate's label file (a JSON object of queries expected)")
    out: dict[str, dict[str, str]] = {}
    for qid, row in data.items():
        solved = row.get("is_solved") if isinstance(row, dict) else None
        if not isinstance(solved, dict):
            raise ReportError(f"{files[0]}: query {qid} has no is_solved labels: not eval_pass_rate's label file")
        out[str(qid)] = {str(k): str(v) for k, v in solved.items()}
    return out


def _labels(bundle: Bundle, score: dict[str, Any]) -> dict[str, Any]:
    """Per group, per query: the judge's label of each evaluation and whether it was solved (``score.json``'s);
    without ``score.json``, the label files' labels, ``solved`` unknown."""
    recorded = bundle.score.get("labels") if score["evaluated"] else None
    out: dict[str, Any] = {}
    for group in bundle.groups:
        if isinstance(recorded, dict) and isinstance(recorded.get(group), dict):
            out[group] = {str(q): {"evaluations": dict(row["evaluations"]), "solved": row.get("solved")}
                          for q, row in recorded[group].items()}
        else:
            from_file = _label_file(bundle, group)
            if from_file is not None:
                out[group] = {q: {"evaluations": ev, "solved": None} for q, ev in from_file.items()}
    return out


@dataclass(frozen=True)
class _Scored:
    """What the score check needs of ``run.json`` (``assemble.Scored``)."""

    label: str
    groups: tuple[str, ...]
    evaluate_times: int
    reference: str | None


def _score_problems(bundle: Bundle, score: dict[str, Any]) -> list[str]:
    """``score.json`` against the label files, with the rule a replay verifies by (``assemble.score_differences``)."""
    if not score["evaluated"]:
        return []
    run = bundle.checked
    if run.evaluate_times is None:
        return ["run.json: no evaluate_times: score.json cannot be checked against the label files"]
    try:
        return score_differences(bundle, _Scored(run.label, tuple(run.groups), run.evaluate_times, run.reference_label))
    except BundleError as exc:
        raise ReportError(str(exc)) from None


def _answers(bundle: Bundle) -> dict[str, dict[str, str]]:
    """Per group, ``{query_id: sha256 of its answer file}``."""
    return {group: {query_id(p): file_sha256(p) for p in bundle.answer_files(group)} for group in bundle.groups}


_Parts = tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]
"""``(records, models, mcp)`` of a bundle's records, each ``None`` when they cannot be read."""


def _records(bundle: Bundle, problems: list[str], progress: bool) -> tuple[_Parts, str | None]:
    """``((records, models, mcp), content hash)`` of the bundle's ``records/`` snapshot, its hash recomputed from its files."""
    root = bundle.records
    try:
        manifest = read_json(root / MANIFEST_NAME)
    except (OSError, ContentsError) as exc:
        problems.append(f"records/{MANIFEST_NAME}: cannot be read ({exc}): the bundle holds no snapshot of the answers served")
        return (None, None, None), None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("content_hash"), str):
        problems.append(f"records/{MANIFEST_NAME}: no content_hash: not a snapshot made by `stabletoolbench-mirror snapshot`")
        return (None, None, None), None
    try:
        actual = tree_hash(root, progress=progress)
    except ArchiveError as exc:
        raise ReportError(f"{root}: {exc}") from None
    if actual != manifest["content_hash"]:
        problems.append(f"records/: the files' content hash {actual} is not their manifest's {manifest['content_hash']}")
    return snapshot_tallies(root, manifest), actual


def _with_roles(models: dict[str, Any] | None, run: dict[str, Any]) -> dict[str, Any] | None:
    """``models`` with each row's ``roles`` (``agent``, ``judge``: by ``run.json``'s models) and ``roles`` itself."""
    roles = {role: run.get(f"{role}_model") for role in ("agent", "judge")}
    if models is None:
        return {"models": [], "calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "roles": roles}
    for row in models["models"]:
        row["roles"] = [role for role, model in roles.items() if model == row["model"]]
    return {**models, "roles": roles}


def _environment(bundle: Bundle, records_hash: str | None, problems: list[str]) -> dict[str, Any]:
    """The hashes to cite and the settings that shaped the answers (``run.json``'s ``environment``, the records' manifest)."""
    env: dict[str, Any] = bundle.run["environment"] if isinstance(bundle.run.get("environment"), dict) else {}
    stated = env.get("records_hash")
    if records_hash is not None and stated is not None and stated != records_hash:
        problems.append(f"run.json: environment.records_hash {stated} is not the records' content hash {records_hash}")
    simulator: dict[str, Any] = env["simulator"] if isinstance(env.get("simulator"), dict) else {}
    manifest_settings = _records_settings(bundle)
    return {
        "records_hash": records_hash,
        "bundle_hash": bundle.content_hash,
        "simulator": {
            "model": simulator.get("model", manifest_settings.get("model")),
            "style": simulator.get("style", manifest_settings.get("style")),
            "prompt_sha256": simulator.get("prompt_sha256"),
        },
        "frozen_caches": env.get("frozen_caches") if isinstance(env.get("frozen_caches"), list) else [],
        "settings": env,
        "stabletoolbench": bundle.run.get("stabletoolbench"),
    }


def _manifest_part(records: Path, part: str) -> Any:
    """``part`` of the records' manifest (``None`` when the manifest cannot be read or is no object)."""
    try:
        manifest = read_json(records / MANIFEST_NAME)
    except (OSError, ContentsError):
        return None
    return manifest.get(part) if isinstance(manifest, dict) else None


def _records_settings(bundle: Bundle) -> dict[str, Any]:
    """The simulator settings in the records' manifest (``snapshot`` writes the store's public settings)."""
    settings = _manifest_part(bundle.records, "settings")
    simulator = settings.get("simulator") if isinstance(settings, dict) else None
    return simulator if isinstance(simulator, dict) else {}


def _simulated_by(records: dict[str, Any] | None, simulator: dict[str, Any]) -> dict[str, Any] | None:
    """The records' simulated answers by model, each row's model and prompt hash from ``run.json`` where the snapshot
    kept none (a snapshot keeps each answer's origin, not its generation's settings; the run had one simulator)."""
    if records is None:
        return None
    for row in records["simulated"]["by_model"]:
        row["model"] = row["model"] or simulator.get("model")
        row["prompt_sha256"] = row["prompt_sha256"] or simulator.get("prompt_sha256")
    return records


AS_PUBLISHED = "as published, not replayed"


def _verification(bundle: Bundle, problems: list[str]) -> dict[str, Any]:
    """Whether the bundle is the bundle of an identical replay or re-score (its ``verdict.json``), or as published.

    ``verified`` only for a replay's own bundle (``score --replay/--rescore ... --out``) whose verdict says every
    file was identical and which agrees with itself (sealed, its score its label files'); a verdict is what the
    replay that wrote it found: it is worth what the machine that ran it is worth (docs/report.md)."""
    verdict = bundle.verdict
    if verdict is None:
        return {"status": AS_PUBLISHED, "verified": False, "kind": None, "replayed": None}
    if not verdict.identical:
        status = f"{verdict.kind}, different"
    elif problems:
        status = f"not verified: a {verdict.kind}'s bundle that does not agree with itself (the problems above)"
    else:
        status = "verified"
    return {"status": status, "verified": status == "verified", "kind": verdict.kind, "replayed": verdict.replayed,
            "differ": list(verdict.differ)}


# -- the report -------------------------------------------------------------------------------------------


def bundle_report(root: Path, progress: bool = False, *, unpacked: bool = False) -> dict[str, Any]:
    """The parts of a report of the bundle at ``root`` (``bundle``, ``environment``, ``score``, ``labels``,
    ``answers``, ``records``, ``models``, ``mcp``, ``problems``); :class:`ReportError` when it is no readable bundle.

    ``unpacked``: ``root`` was unpacked from an archive here, beside the marker the unpacking wrote
    (:data:`~stabletoolbench_mirror.upstream.archives.MARKER`), which is no file of the bundle.
    """
    try:
        bundle = read_bundle(root)
        changed = [d for d in verify(root) if not (unpacked and d.path == MARKER and d.change == "added")]
    except BundleError as exc:
        raise ReportError(str(exc)) from None
    problems = [str(d) for d in changed]
    evaluate_times = bundle.checked.evaluate_times
    score = _score(bundle)
    labels = _labels(bundle, score)
    problems += _score_problems(bundle, score)
    (records, models, mcp), records_hash = _records(bundle, problems, progress)
    environment = _environment(bundle, records_hash, problems)
    return {
        "bundle": {
            "content_hash": bundle.content_hash, "sealed_at": bundle.manifest.get("sealed_at"),
            "mirror_version": bundle.manifest.get("mirror_version"), "sealed": not changed,
            "changed": [{"path": d.path, "change": d.change} for d in changed],
            **{fact: bundle.run.get(fact) for fact in RUN_FACTS},
            "verification": _verification(bundle, problems),
        },
        "environment": environment,
        "score": {**score, "evaluate_times": evaluate_times},
        "labels": labels,
        "answers": _answers(bundle),
        "records": _simulated_by(records, environment["simulator"]),
        "models": _with_roles(models, bundle.run),
        "mcp": mcp,
        "problems": problems,
    }


# -- two bundles side by side -------------------------------------------------------------------------------


def _rate(report: dict[str, Any], group: str) -> float | None:
    row = report["score"]["pass_rate"].get(group)
    return row["solve_rate"] if row else None


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _label_multiset(row: Mapping[str, Any] | None) -> list[str] | None:
    return sorted(row["evaluations"].values()) if row else None


def _group_comparison(a: dict[str, Any], b: dict[str, Any], group: str) -> dict[str, Any]:
    answers_a, answers_b = a["answers"].get(group, {}), b["answers"].get(group, {})
    labels_a, labels_b = a["labels"].get(group, {}), b["labels"].get(group, {})
    label_diffs = []
    for qid in sorted(set(labels_a) | set(labels_b), key=_query_order):
        row_a, row_b = labels_a.get(qid), labels_b.get(qid)
        if _label_multiset(row_a) != _label_multiset(row_b) or (row_a or {}).get("solved") != (row_b or {}).get("solved"):
            label_diffs.append({"query_id": qid, "a": row_a, "b": row_b})
    rate_a, rate_b = _rate(a, group), _rate(b, group)
    return {
        "solve_rate_a": rate_a, "solve_rate_b": rate_b, "difference": _difference(rate_a, rate_b),
        "answers_differ": sorted((q for q in set(answers_a) & set(answers_b) if answers_a[q] != answers_b[q]), key=_query_order),
        "answers_only_a": sorted(set(answers_a) - set(answers_b), key=_query_order),
        "answers_only_b": sorted(set(answers_b) - set(answers_a), key=_query_order),
        "labels_differ": label_diffs,
    }


def _query_order(qid: str) -> tuple[int, str]:
    return (int(qid), "") if qid.isdigit() else (1 << 62, qid)


def _api_hashes(root: Path) -> dict[str, str]:
    hashes = _manifest_part(root / "records", "api_hashes")
    return {str(k): str(v) for k, v in hashes.items()} if isinstance(hashes, dict) else {}


def _records_comparison(root_a: Path, root_b: Path) -> dict[str, Any]:
    """Which APIs' answers differ between the two records snapshots (from their manifests' ``api_hashes``)."""
    a, b = _api_hashes(root_a), _api_hashes(root_b)
    changed = sorted(api for api in set(a) & set(b) if a[api] != b[api])
    out: dict[str, Any] = {}
    for name, apis in (("changed", changed), ("only_a", sorted(set(a) - set(b))), ("only_b", sorted(set(b) - set(a)))):
        out[name] = {"tools": [api for api in apis if model_endpoint(api) is None],
                     "models": [api for api in apis if model_endpoint(api) is not None]}
    return out


def _replay_of(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """``{"replayed", "by", "status"}`` when one bundle is the other's replay (its verdict names the other's content hash)."""
    sides = {"a": a, "b": b}
    for by, replayed in (("b", "a"), ("a", "b")):
        verification = sides[by]["bundle"]["verification"]
        if verification["replayed"] is not None and verification["replayed"] == sides[replayed]["bundle"]["content_hash"]:
            return {"replayed": replayed, "by": by, "kind": verification["kind"], "status": verification["status"]}
    return None


def compare(a: dict[str, Any], b: dict[str, Any], root_a: Path, root_b: Path) -> dict[str, Any]:
    """Where two bundles' reports differ: per group the solve rates and their difference (B - A), the queries
    whose answer files differ, those whose labels differ (the evaluations' labels as a multiset: which
    evaluation got which label may be permuted by the judge's threads, see docs/model-calls.md#threads),
    the records' APIs whose answers differ, and the averages."""
    groups = list(dict.fromkeys([*a["bundle"]["groups"], *b["bundle"]["groups"]]))
    per_group = {group: _group_comparison(a, b, group) for group in groups}
    average_a, average_b = a["score"]["pass_rate_average"], b["score"]["pass_rate_average"]
    records = _records_comparison(root_a, root_b)
    differs = (a["environment"]["records_hash"] != b["environment"]["records_hash"]
               or average_a != average_b
               or any(g["solve_rate_a"] != g["solve_rate_b"] or g["answers_differ"] or g["answers_only_a"] or g["answers_only_b"] or g["labels_differ"]
                      for g in per_group.values()))
    return {
        "same": not differs and not a["problems"] and not b["problems"],
        "replay": _replay_of(a, b),
        "groups": per_group,
        "average": {"a": average_a, "b": average_b, "difference": _difference(average_a, average_b)},
        "win_rate_average": {"a": a["score"]["win_rate_average"], "b": b["score"]["win_rate_average"]},
        "records": {"same": a["environment"]["records_hash"] == b["environment"]["records_hash"], **records},
    }
