"""A run's work folder into a sealed bundle, a bundle's files back into a work folder, and a replay compared with its bundle.

The work folder is laid out as the bundle (:mod:`.bundle`), so a bundle is its files copied, plus
``records/`` (the served store's snapshot), ``run.json`` and ``score.json``, then sealed.  A replay or a
re-score seeds a new work folder from the bundle (its queries, test ids, the reference's files, for a
re-score its answer files), runs upstream again and compares every file it wrote with the bundle's, byte
for byte, naming each that differs.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.config import Settings
from stabletoolbench_mirror.core.files import write_text
from stabletoolbench_mirror.core.secrets import public_url
from stabletoolbench_mirror.scoring import bundle as layout
from stabletoolbench_mirror.scoring import contents
from stabletoolbench_mirror.scoring.score import ScoreError, mean_or_none, pass_rate_file, win_rate
from stabletoolbench_mirror.scoring.session import RunSpec, State, Work

SEED_NOTE = ("random.seed(seed) and PYTHONHASHSEED=seed in every upstream process, one evaluation thread; upstream's "
             "tooleval/utils.py and pipeline_runner.run also call random.seed(42) themselves")


def _copy(source: Path, target: Path, root: Path) -> None:
    """``source`` copied to ``target``, which must lie inside ``root`` (:func:`.bundle.inside`)."""
    target = layout.inside(root, target)
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


class Scored(Protocol):
    """What :func:`score_of` needs of a run (a :class:`.session.RunSpec`, or the facts a report has)."""

    @property
    def label(self) -> str: ...
    @property
    def groups(self) -> Sequence[str]: ...
    @property
    def evaluate_times(self) -> int: ...
    @property
    def reference(self) -> str | None: ...


def score_of(root: Path, spec: Scored) -> dict[str, Any]:
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


#: how far a figure of ``score.json`` may be from the one its label files give (it is written from them, a JSON float
#: reads back exactly: only a different order of the same sum may differ, in its last digits)
FIGURE_TOLERANCE = 1e-9
#: the differences a score check names at most (a fabricated score differs everywhere)
NAMED = 20


class ScoreDisagrees(RuntimeError):
    """A bundle's ``score.json`` is not what its label files give (the message names each number): nothing to verify."""


def score_differences(bundle: layout.Bundle, spec: Scored) -> list[str]:
    """Where the bundle's ``score.json`` is not what its label (and preference) files give under :mod:`.score`'s
    rules, one line per number (``score.json: pass_rate.G1_tool.solve_rate: the bundle says 99.9, its label files
    give 45.8``); a bundle with no group, no ``score.json`` or a group without its label file scored nothing."""
    if not spec.groups:
        return [f"{layout.RUN_FILE}: groups is empty: the bundle scores nothing, so there is nothing to verify"]
    if not bundle.score:
        return [f"{layout.SCORE_FILE}: missing: the bundle has no score to verify"]
    needed = [layout.pass_rate_files(spec.label, g)[0] for g in spec.groups]
    if spec.reference is not None:
        needed += [layout.preference_files(spec.reference, spec.label, g)[0] for g in spec.groups]
    missing = [f"{relative}: missing: the score.json of its group comes from no label file" for relative in needed
               if not bundle.path(relative).is_file()]
    if missing:
        return missing
    try:
        again = score_of(bundle.root, spec)
    except ScoreError as exc:
        return [str(exc)]
    found: list[str] = []
    _differences("", bundle.score, again, found)
    shown = found[:NAMED] + ([f"... and {len(found) - NAMED} more"] if len(found) > NAMED else [])
    return [f"{layout.SCORE_FILE}: {line}" for line in shown]


def _differences(where: str, theirs: Any, ours: Any, found: list[str]) -> None:
    """Each number (or other value) of ``theirs`` (the bundle's) that is not ``ours`` (recomputed), by its path."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for key in sorted(set(theirs) | set(ours), key=str):
            if key not in ours:
                found.append(f"{where}{key}: the bundle says {_shown(theirs[key])}, its label files give nothing")
            elif key not in theirs:
                found.append(f"{where}{key}: the bundle has none, its label files give {_shown(ours[key])}")
            else:
                _differences(f"{where}{key}.", theirs[key], ours[key], found)
        return
    if isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            _differences(f"{where}{i}.", a, b, found)
        return
    if _same_figure(theirs, ours):
        return
    found.append(f"{where.rstrip('.')}: the bundle says {_shown(theirs)}, its label files give {_shown(ours)}")


def _same_figure(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return bool(a == b and type(a) is type(b)) or (a is None and b is None)
    return math.isclose(a, b, rel_tol=FIGURE_TOLERANCE, abs_tol=FIGURE_TOLERANCE)


def _shown(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)[:80]


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
             write_records: Callable[[Path], dict[str, Any]], verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the bundle of ``work`` into the folder ``out`` (new or empty, inside ``work``) and seal it; return the seal.

    ``write_records(folder)`` snapshots the served store into ``folder`` and returns its manifest; ``verdict``: a
    replay's or re-score's ``verdict.json`` (:class:`.contents.VerdictFile`).
    """
    out = work.inside(out)
    if out.exists() and any(out.iterdir()):
        raise layout.BundleError(f"{out} is not empty: a bundle is written into a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    for group in spec.groups:
        _copy(work.queries(group), out / layout.QUERIES_DIR / f"{group}.json", out)
        _copy(work.test_ids / f"{group}.json", out / layout.TEST_IDS_DIR / f"{group}.json", out)
        for relative in answer_files(work.root, group):
            _copy(work.path(relative), out / relative, out)
        if spec.reference is not None:
            ref = spec.reference
            _copy(work.converted / ref / f"{group}.json", out / layout.reference_converted_file(ref, group), out)
            _copy(work.pass_rate / ref / f"{group}_{ref}.csv", out / layout.reference_pass_rate_file(ref, group), out)
    for relative in (p for group in spec.groups for p in group_files(spec, group)):
        if work.path(relative).is_file():
            _copy(work.path(relative), out / relative, out)
    for log in sorted((work.root / layout.LOGS_DIR).glob("*.log")):
        _copy(log, out / layout.LOGS_DIR / log.name, out)
    records = write_records(layout.inside(out, layout.RECORDS_DIR))
    write_text(layout.inside(out, layout.RUN_FILE), _dump(run_json(spec, state, env, records)))
    write_text(layout.inside(out, layout.SCORE_FILE), _dump(score_of(out, spec)))
    if verdict is not None:
        write_text(layout.inside(out, layout.VERDICT_FILE), _dump(verdict))
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
    _copy(converted, work.converted / reference / f"{group}.json", work.root)
    _copy(table, work.pass_rate / reference / f"{group}_{reference}.csv", work.root)


def seed_work(bundle: layout.Bundle, spec: RunSpec, work: Work, *, answers: bool) -> None:
    """Copy what the replay reads from ``bundle`` into ``work``: queries, test ids, the reference's files,
    and (``answers``: a re-score) the answer files; each JSON file read bounded first (:func:`.contents.read_json`), so
    that what upstream's scripts and the session parse is no larger or deeper than a run writes."""
    for group in spec.groups:
        _copy(_bounded(bundle, f"{layout.QUERIES_DIR}/{group}.json"), work.queries(group), work.root)
        _copy(_bounded(bundle, f"{layout.TEST_IDS_DIR}/{group}.json"), work.test_ids / f"{group}.json", work.root)
        if spec.reference is not None:
            place_reference(work, spec.reference, group, _bounded(bundle, layout.reference_converted_file(spec.reference, group)),
                            bundle.path(layout.reference_pass_rate_file(spec.reference, group)))
        if answers:
            shutil.rmtree(work.answers(group), ignore_errors=True)
            for relative in answer_files(bundle.root, group):
                _copy(_bounded(bundle, relative), work.path(relative), work.root)


def _bounded(bundle: layout.Bundle, relative: str) -> Path:
    """``relative`` in ``bundle``, its JSON read bounded: :class:`.bundle.BundleError` when it is too large or deep, or no JSON."""
    path = layout.inside(bundle.root, relative)
    try:
        contents.read_json(path)
    except FileNotFoundError:
        raise layout.BundleError(f"{bundle.root}: no {relative}: the bundle is incomplete") from None
    except contents.ContentsError as exc:
        raise layout.BundleError(str(exc)) from None
    return path


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


def answer_settings(settings: Settings, prompt: dict[str, Any] | None = None) -> dict[str, Any]:
    """The server's settings that shape answers (``run.json``'s ``environment``), no secret in them; ``prompt``: the
    simulator's system prompt as the server's ``/health`` names it (``source``, ``sha256``)."""
    sim = settings.simulator
    simulator: dict[str, Any] = {"enabled": False}
    if sim.enabled:
        simulator = {"enabled": True, "style": sim.style, "model": sim.model, "temperature": sim.temperature,
                     "api_base": [public_url(u) for u in sim.endpoints],
                     "prompt_source": (prompt or {}).get("source"), "prompt_sha256": (prompt or {}).get("sha256")}
    return {
        "mode": str(settings.mode), "llm_mode": str(settings.llm.mode or settings.mode),
        "frozen_caches": [_frozen_note(settings, p) for p in settings.frozen_caches],
        "real": {"enabled": settings.real.enabled, "backend": settings.real.backend},
        "simulator": simulator,
        "llm_upstreams": [{"base_url": public_url(u.base_url), "models": list(u.models)} for u in settings.llm.upstreams],
    }


def _frozen_note(settings: Settings, configured: str) -> dict[str, Any]:
    path = Path(settings.resolve(configured)) if "://" not in configured else None
    manifest = path / "manifest.json" if path is not None else None
    content_hash = None
    if manifest is not None and manifest.is_file():
        try:
            content_hash = json.loads(manifest.read_text(encoding="utf-8")).get("content_hash")
        except (OSError, ValueError):
            content_hash = None
    return {"path": public_url(configured) if "://" in configured else configured, "content_hash": content_hash}
