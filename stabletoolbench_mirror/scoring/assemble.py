"""A run's work folder into a sealed bundle, a bundle's files back into a work folder, and a replay compared with its bundle.

The work folder is laid out as the bundle (:mod:`.bundle`), so a bundle is its files copied, plus
``records/`` (the served store's snapshot), ``run.json`` and ``score.json``, then sealed.  A replay or a
re-score seeds a new work folder from the bundle (its queries, test ids, the reference's files, for a
re-score its answer files), runs upstream again and compares every file it wrote with the bundle's, byte
for byte, naming each that differs.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.scoring import bundle as layout
from stabletoolbench_mirror.scoring.score import mean_or_none, pass_rate_file, win_rate
from stabletoolbench_mirror.scoring.session import RunSpec, State, Work

SEED_NOTE = ("random.seed(seed) and PYTHONHASHSEED=seed in every upstream process, one evaluation thread; upstream's "
             "tooleval/utils.py and pipeline_runner.run also call random.seed(42) themselves")


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def group_files(spec: RunSpec, group: str) -> list[str]:
    """The bundle paths of one group's evaluation (what a replay compares beside the answer files): the
    converted answers, the label files, the preference files."""
    paths = [layout.converted_file(spec.label, group), *layout.pass_rate_files(spec.label, group)]
    if spec.reference is not None:
        paths += layout.preference_files(spec.reference, spec.label, group)
    return paths


def answer_files(root: Path, group: str) -> list[str]:
    folder = root / layout.answers_dir(group)
    return sorted(f"{layout.answers_dir(group)}/{p.name}" for p in folder.glob("*.json")) if folder.is_dir() else []


# -- the score -----------------------------------------------------------------------------------------


def score_of(root: Path, spec: RunSpec) -> dict[str, Any]:
    """``score.json`` from the label (and preference) files under ``root`` (see :mod:`.score`)."""
    rates: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    wins: dict[str, Any] = {}
    for group in spec.groups:
        labels_file = root / layout.pass_rate_files(spec.label, group)[0]
        if labels_file.is_file():
            rates[group], labels[group] = pass_rate_file(labels_file, spec.evaluate_times)
        if spec.reference is not None:
            preference = root / layout.preference_files(spec.reference, spec.label, group)[0]
            if preference.is_file():
                wins[group] = win_rate(preference, spec.reference, spec.label)
    return {
        "pass_rate": rates,
        "pass_rate_average": mean_or_none([r["solve_rate"] for r in rates.values()]),
        "win_rate": wins,
        "win_rate_average": mean_or_none([w["win"] for w in wins.values()]) if spec.reference is not None else None,
        "labels": labels,
    }


# -- the bundle from a work folder ---------------------------------------------------------------------


@dataclass
class Environment:
    """What ``run.json`` says about the run beyond its spec."""

    checkout: dict[str, Any]
    """``{"commit", "dirty"}``."""
    settings: dict[str, Any]
    """The server's settings that shape answers (simulator, frozen caches, modes)."""
    reference: dict[str, Any] | None = None
    """``{"label", "content_hash"}`` of the reference bundle."""
    extra: dict[str, Any] = field(default_factory=dict)


def assemble(work: Work, spec: RunSpec, state: State, out: Path, env: Environment,
             write_records: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Write the bundle of ``work`` into the folder ``out`` (new or empty) and seal it; return the seal.

    ``write_records(folder)`` snapshots the served store into ``folder`` and returns its manifest.
    """
    if out.exists() and any(out.iterdir()):
        raise layout.BundleError(f"{out} is not empty: a bundle is written into a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    for group in spec.groups:
        _copy(work.queries(group), out / layout.QUERIES_DIR / f"{group}.json")
        _copy(work.test_ids / f"{group}.json", out / layout.TEST_IDS_DIR / f"{group}.json")
        for relative in answer_files(work.root, group):
            _copy(work.path(relative), out / relative)
        if spec.reference is not None:
            ref = spec.reference
            _copy(work.converted / ref / f"{group}.json", out / layout.reference_converted_file(ref, group))
            _copy(work.pass_rate / ref / f"{group}_{ref}.csv", out / layout.reference_pass_rate_file(ref, group))
    for relative in (p for group in spec.groups for p in group_files(spec, group)):
        if work.path(relative).is_file():
            _copy(work.path(relative), out / relative)
    for log in sorted((work.root / layout.LOGS_DIR).glob("*.log")):
        _copy(log, out / layout.LOGS_DIR / log.name)
    records = write_records(out / layout.RECORDS_DIR)
    write_text(out / layout.RUN_FILE, _dump(run_json(spec, state, env, records)))
    write_text(out / layout.SCORE_FILE, _dump(score_of(out, spec)))
    return layout.seal(out)


def run_json(spec: RunSpec, state: State, env: Environment, records: dict[str, Any]) -> dict[str, Any]:
    data = spec.as_json()
    data["reference"] = env.reference
    data["seed_note"] = SEED_NOTE
    data["stabletoolbench"] = env.checkout
    data["environment"] = {"records_hash": records.get("content_hash"), "records_entries": records.get("entries"),
                           "records_by_source": records.get("by_source"), **env.settings}
    data["commands"] = [{k: v for k, v in c.items() if k != "phase_key"} for c in state.commands]
    data["mirror_version"] = __version__
    data["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data.update(env.extra)
    return data


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# -- a work folder from a bundle -----------------------------------------------------------------------


def place_reference(work: Work, reference: str, group: str, converted: Path, table: Path) -> None:
    """The reference run's converted answers and label table where ``eval_preference`` reads them (and the bundle
    takes them from): ``converted/<ref>/<group>.json`` and ``pass_rate/<ref>/<group>_<ref>.csv``."""
    _copy(converted, work.converted / reference / f"{group}.json")
    _copy(table, work.pass_rate / reference / f"{group}_{reference}.csv")


def seed_work(bundle: layout.Bundle, spec: RunSpec, work: Work, *, answers: bool) -> None:
    """Copy what the replay reads from ``bundle`` into ``work``: queries, test ids, the reference's files,
    and (``answers``: a re-score) the answer files."""
    for group in spec.groups:
        _copy(bundle.path(f"{layout.QUERIES_DIR}/{group}.json"), work.queries(group))
        _copy(bundle.path(f"{layout.TEST_IDS_DIR}/{group}.json"), work.test_ids / f"{group}.json")
        if spec.reference is not None:
            place_reference(work, spec.reference, group, bundle.path(layout.reference_converted_file(spec.reference, group)),
                            bundle.path(layout.reference_pass_rate_file(spec.reference, group)))
        if answers:
            shutil.rmtree(work.answers(group), ignore_errors=True)
            for relative in answer_files(bundle.root, group):
                _copy(bundle.path(relative), work.path(relative))


# -- comparing a replay with its bundle ----------------------------------------------------------------


@dataclass
class GroupComparison:
    group: str
    answers: tuple[int, int] = (0, 0)
    """Identical answer files, and the bundle's count."""
    files: dict[str, bool] = field(default_factory=dict)
    """Each converted, label and preference file: identical or not."""
    differ: list[str] = field(default_factory=list)
    """Every file (bundle path) that differs, is missing from the replay or was not in the bundle."""

    @property
    def identical(self) -> bool:
        return not self.differ

    def as_json(self) -> dict[str, Any]:
        return {"group": self.group, "identical": self.identical, "answers_identical": self.answers[0], "answers": self.answers[1],
                "files": self.files, "differ": self.differ}


def compare(bundle: layout.Bundle, spec: RunSpec, work: Work, *, answers: bool) -> list[GroupComparison]:
    """Each group's files of the replay in ``work`` against the bundle's, byte for byte."""
    out = []
    for group in spec.groups:
        result = GroupComparison(group)
        if answers:
            theirs, ours = answer_files(bundle.root, group), answer_files(work.root, group)
            same = [p for p in theirs if p in ours and _same(bundle.path(p), work.path(p))]
            result.answers = (len(same), len(theirs))
            result.differ += sorted((set(theirs) | set(ours)) - set(same))
        for relative in group_files(spec, group):
            if not bundle.path(relative).exists() and not work.path(relative).exists():
                continue  # a file upstream wrote in neither run (eval_preference's .csv, see session._preference)
            identical = _same(bundle.path(relative), work.path(relative))
            result.files[relative] = identical
            if not identical:
                result.differ.append(relative)
        out.append(result)
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False
