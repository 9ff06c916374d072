"""A score bundle: one StableToolBench run, sealed, so that it can be replayed and re-scored anywhere.

``stabletoolbench-mirror score`` runs StableToolBench's own inference and evaluation through the server and
ends with a bundle: a folder (or the same folder as a ``.tar.gz``) laid out as below.  Paths are relative
to the bundle's root, ``/``-separated; ``<label>`` is the run's name in StableToolBench's evaluation
(its ``--reference_model`` / ``--output_model``), ``<group>`` a test set such as ``G1_instruction``.

=========================================== ==========================================================
``bundle.json``                             the seal (:data:`BUNDLE_FILE`): format, every hashed file's
                                            SHA-256, the content hash over them; not hashed itself
``run.json``                                what was run (:data:`RUN_FILE`): groups, method, backbone,
                                            agent and judge models, evaluator, ``evaluate_times``,
                                            limit, reference, StableToolBench's commit, the server's
                                            settings that shape answers, each command line
``score.json``                              the score (:data:`SCORE_FILE`): SoPR per group and on
                                            average, SoWR when a reference was named, labels per query
``verdict.json``                            only in the bundle a replay or re-score writes (``--out``):
                                            the content hash of the bundle it ran again, whether every
                                            file was identical and its score what its labels give
``records/``                                a snapshot (``snapshot``'s format: ``manifest.json`` and an
                                            upstream ``tool_response_cache`` tree) of every answer the
                                            run was served, tool answers and model calls (``@model/``)
``queries/<group>.json``                    the queries ``qa_pipeline`` read (after ``--limit``)
``test_ids/<group>.json``                   the query ids the evaluation read (``--test_ids``)
``answers/<group>/<qid>_<method>.json``     ``qa_pipeline``'s answer files, as it wrote them
``converted/<label>/<group>.json``          ``convert_to_answer_format``'s output
``pass_rate/<label>/<group>_<label>.json``  ``eval_pass_rate``'s label files (and ``.csv``)
``preference/<group>_<ref>_<label>.json``   ``eval_preference``'s files (and ``.csv``), with a reference
``reference/<ref>/...``                     what ``eval_preference`` read of the reference run: its
                                            ``converted/<group>.json`` and ``pass_rate/<group>_<ref>.csv``
``logs/``                                   each step's output: kept, never hashed (paths and timings
                                            differ from one machine to the next)
=========================================== ==========================================================

``run.json`` holds at least ``label``, ``groups`` (list), ``method``, ``backbone``, ``agent_model``,
``judge_model``, ``evaluator``, ``evaluate_times``, ``limit`` (``null``: every query), ``reference``
(``null`` or ``{"label", "content_hash"}``), ``stabletoolbench`` (``{"commit", "dirty"}``, ``null`` values
when not a git checkout), ``environment`` (``records_hash``: the records' snapshot content hash; the
settings that shape answers: simulator model, style and prompt hash, frozen caches' content hashes) and
``commands`` (``[{"phase", "group", "argv", "env"}]``, no secret in them), ``run_id`` (the part of its model-call
runs' names that is the run's own), ``stand_ins`` and, for a re-score with another judge, ``rescored_from``
(``{"content_hash", "label", "judge_model"}`` of the bundle whose answers were evaluated).  ``score.json`` holds
``pass_rate`` (``{group: {"solve_rate", "std", "per_evaluation", "queries"}}``, percent, as
``eval_pass_rate`` computes them: per evaluation, Solved 1 and Unsure 0.5 over the queries; their mean and
population standard deviation), ``pass_rate_average`` (the mean of the groups' solve rates), ``win_rate``
(``{group: {"win", "tie", "lose", "queries"}}``, fractions, as ``eval_preference`` prints them; ``{}``
without a reference), ``win_rate_average`` (``null`` without one) and ``labels``
(``{group: {query_id: {"evaluations": {"0": "AnswerStatus.Solved", ...}, "solved": bool}}}``, ``solved``
by the majority of the evaluations).

The **content hash** is SHA-256 over one line per hashed file, ``<path>\\t<sha256 hex of its bytes>\\n``,
sorted by path: every file but ``bundle.json``, ``logs/`` and an unpacked archive's ``.stm-unpacked.json``
(:func:`content_hash`).  It covers the
records, so the environment, and the answers, labels and score; two bundles with one hash hold the same
bytes.  :func:`verify` recomputes it and names every file added, removed or changed since the seal.

Written here by hand: a bundle is this project's own format (a folder of files and their digests, as a
wheel's ``RECORD`` is); ``hashlib`` and ``json`` are the libraries.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from stabletoolbench_mirror import __version__
from stabletoolbench_mirror.core.files import atomic_write
from stabletoolbench_mirror.scoring import contents
from stabletoolbench_mirror.scoring.replayable import problems
from stabletoolbench_mirror.upstream.archives import MARKER as UNPACKED_MARKER
from stabletoolbench_mirror.upstream.archives import file_sha256

if TYPE_CHECKING:
    from stabletoolbench_mirror.upstream.archive_limits import ArchiveLimits

FORMAT = "stabletoolbench-mirror-score-bundle"
FORMAT_VERSION = 1

BUNDLE_FILE = "bundle.json"
RUN_FILE = "run.json"
SCORE_FILE = "score.json"
VERDICT_FILE = "verdict.json"
RECORDS_DIR = "records"
QUERIES_DIR = "queries"
TEST_IDS_DIR = "test_ids"
ANSWERS_DIR = "answers"
CONVERTED_DIR = "converted"
PASS_RATE_DIR = "pass_rate"
PREFERENCE_DIR = "preference"
REFERENCE_DIR = "reference"
LOGS_DIR = "logs"
#: what the content hash leaves out: the seal itself, the steps' output, and the marker an unpacked archive's
#: folder gets (:data:`..upstream.archives.MARKER`: which archive it came from)
UNHASHED = frozenset({BUNDLE_FILE, LOGS_DIR, UNPACKED_MARKER})


class BundleError(RuntimeError):
    """A bundle cannot be read or trusted (the message names the file and the fix)."""


class SealError(BundleError):
    """A bundle whose files are not as its seal says (a folder or an archive changed since it was sealed)."""


# -- where each file of a run lives --------------------------------------------------------------------


def answers_dir(group: str) -> str:
    """``answers/<group>``: ``qa_pipeline``'s ``--output_answer_file`` for one group."""
    return f"{ANSWERS_DIR}/{group}"


def converted_file(label: str, group: str) -> str:
    return f"{CONVERTED_DIR}/{label}/{group}.json"


def pass_rate_files(label: str, group: str) -> tuple[str, str]:
    """``eval_pass_rate``'s two label files of one group: ``(.json, .csv)``."""
    stem = f"{PASS_RATE_DIR}/{label}/{group}_{label}"
    return f"{stem}.json", f"{stem}.csv"


def preference_files(reference: str, label: str, group: str) -> tuple[str, str]:
    """``eval_preference``'s two files of one group: ``(.json, .csv)``."""
    stem = f"{PREFERENCE_DIR}/{group}_{reference}_{label}"
    return f"{stem}.json", f"{stem}.csv"


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` (absolute, or relative to ``root``) resolved, checked to lie inside ``root``: what ``score`` writes, copies,
    moves or removes goes through here first.  :class:`BundleError` naming both when it does not."""
    base = Path(root).resolve()
    target = (base / path).resolve()
    if not target.is_relative_to(base):
        raise BundleError(f"{path}: not inside the work folder {base}: nothing is written or removed outside it")
    return target


# -- the content hash ----------------------------------------------------------------------------------


def _hashed(relative: PurePosixPath) -> bool:
    return relative.parts[0] not in UNHASHED


def iter_hashed_files(root: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of every hashed file under ``root``, sorted by relative path.

    A symbolic link or anything but a regular file or folder is refused: a bundle is plain files.
    """
    base = Path(root)
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(base):
        here = Path(folder)
        for name in (*dirs, *files):
            path = here / name
            if path.is_symlink():
                raise BundleError(f"{path}: a bundle holds no symbolic links (copy the file in its place)")
        for name in files:
            path = here / name
            relative = PurePosixPath(path.relative_to(base).as_posix())
            if not path.is_file():
                raise BundleError(f"{path}: a bundle holds only regular files and folders")
            if _hashed(relative):
                found.append((str(relative), path))
    found.sort(key=lambda item: item[0])
    return iter(found)


def file_digests(root: str | os.PathLike[str]) -> dict[str, str]:
    """``{relative path: sha256 hex}`` of every hashed file under ``root``."""
    return {relative: file_sha256(path) for relative, path in iter_hashed_files(root)}


def content_hash(digests: Mapping[str, str]) -> str:
    """``sha256:<hex>`` over ``<path>\\t<sha256>\\n`` lines sorted by path (see the module's docstring)."""
    digest = hashlib.sha256()
    for relative in sorted(digests):
        digest.update(f"{relative}\t{digests[relative]}\n".encode("utf-8", "surrogatepass"))
    return "sha256:" + digest.hexdigest()


# -- sealing and checking ------------------------------------------------------------------------------


def seal(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``bundle.json`` for the files under ``root`` as they are now; return it.

    :class:`BundleError` when there is no ``run.json``, or when a recorded model call of ``records/`` could not
    replay from the bundle alone (:mod:`.replayable`): such a bundle is never sealed."""
    digests = file_digests(root)
    if RUN_FILE not in digests:
        raise BundleError(f"{root}: no {RUN_FILE}: a bundle names what was run")
    unreplayable = problems(Path(root, RECORDS_DIR))
    if unreplayable:
        shown = "\n  ".join(unreplayable[:20])
        raise BundleError(f"{root}: not sealed: its records would not replay (a replay numbers each model request's occurrences "
                          f"from #1, and would stop at the first one missing, 'occurrence N is not recorded'):\n  {shown}\n"
                          "record the run again in a new work folder: each record run counts its model calls from #1 in runs of its own")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "mirror_version": __version__,
        "sealed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "content_hash": content_hash(digests),
        "files": digests,
    }
    with atomic_write(Path(root, BUNDLE_FILE)) as handle:
        json.dump(manifest, handle, ensure_ascii=False, indent=2, sort_keys=False)
        handle.write("\n")
    return manifest


@dataclass(frozen=True)
class Difference:
    """One file that is not as the seal says: ``added``, ``removed`` or ``changed``."""

    path: str
    change: str

    def __str__(self) -> str:
        return f"{self.path}: {self.change} since the bundle was sealed"


def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The seal of the bundle at ``root``, checked for its format (:class:`BundleError` naming the fix)."""
    path = Path(root, BUNDLE_FILE)
    manifest = _read_json(Path(root), BUNDLE_FILE, missing="not a score bundle (made by `stabletoolbench-mirror score ... --out`)")
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: not a score bundle's seal (format {FORMAT!r} expected)")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BundleError(f"{path}: bundle format {version!r} is newer than this version reads ({FORMAT_VERSION}): "
                          f"upgrade stabletoolbench-mirror (this is {__version__})")
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("content_hash"), str):
        raise BundleError(f"{path}: the seal has no files or content_hash")
    _checked(contents.Seal, manifest, path)
    return manifest


def _checked(model: type[contents.Checked], data: Any, path: Path) -> contents.Checked:
    try:
        return contents.check(model, data, str(path))
    except contents.ContentsError as exc:
        raise BundleError(str(exc)) from None


def verify(root: str | os.PathLike[str]) -> list[Difference]:
    """Every file added, removed or changed since ``root`` was sealed (empty: the bundle is as sealed).

    :class:`BundleError` when there is no readable seal.
    """
    manifest = read_manifest(root)
    sealed: dict[str, str] = manifest["files"]
    now = file_digests(root)
    differences = [Difference(p, "removed") for p in sorted(set(sealed) - set(now))]
    differences += [Difference(p, "added") for p in sorted(set(now) - set(sealed))]
    differences += [Difference(p, "changed") for p in sorted(set(now) & set(sealed)) if now[p] != sealed[p]]
    if not differences and content_hash(sealed) != manifest["content_hash"]:
        differences.append(Difference(BUNDLE_FILE, "content_hash does not match its files list"))
    differences.sort(key=lambda d: d.path)
    return differences


# -- reading -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bundle:
    """A bundle folder, read: its seal, what was run and the score (see the module's docstring)."""

    root: Path
    manifest: dict[str, Any]
    run: dict[str, Any]
    score: dict[str, Any]
    checked: contents.RunFile
    """``run.json``, checked (:mod:`.contents`): its names are plain, its numbers in range."""
    verdict: contents.VerdictFile | None = None
    """``verdict.json``: in the bundle of a replay or re-score, what it found (``None``: a bundle as recorded)."""

    @property
    def content_hash(self) -> str:
        return str(self.manifest["content_hash"])

    @property
    def label(self) -> str:
        return self.checked.label

    @property
    def groups(self) -> list[str]:
        return list(self.checked.groups)

    @property
    def records(self) -> Path:
        return self.root / RECORDS_DIR

    def path(self, relative: str) -> Path:
        return self.root / relative

    def answer_files(self, group: str) -> list[Path]:
        """One group's answer files, sorted by name."""
        folder = self.root / answers_dir(group)
        return sorted(p for p in folder.glob("*.json")) if folder.is_dir() else []

    def label_files(self, group: str) -> list[Path]:
        """One group's pass-rate label files (``.json``, ``.csv``) that exist."""
        return [self.root / p for p in pass_rate_files(self.label, group) if (self.root / p).is_file()]


def _read_json(root: Path, name: str, *, missing: str = "the bundle is incomplete") -> dict[str, Any]:
    """The JSON object in ``root/name``, read bounded (:func:`.contents.read_json`); :class:`BundleError` naming the
    file (``missing``: what its absence means)."""
    path = root / name
    try:
        data = contents.read_json(path)
    except FileNotFoundError:
        raise BundleError(f"{root}: no {name}: {missing}") from None
    except contents.ContentsError as exc:
        raise BundleError(str(exc)) from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: a JSON object expected")
    return data


def read_bundle(root: str | os.PathLike[str]) -> Bundle:
    """The bundle folder at ``root``, its seal's format and its contents checked (:mod:`.contents`; :func:`verify`
    checks its files): :class:`BundleError` naming the file and the field."""
    base = Path(root)
    manifest = read_manifest(base)
    run = _read_json(base, RUN_FILE)
    checked = _checked(contents.RunFile, run, base / RUN_FILE)
    score = _read_json(base, SCORE_FILE) if (base / SCORE_FILE).exists() else {}
    if score:
        _checked(contents.ScoreFile, score, base / SCORE_FILE)
    verdict = _checked(contents.VerdictFile, _read_json(base, VERDICT_FILE), base / VERDICT_FILE) if (base / VERDICT_FILE).exists() else None
    return Bundle(base, manifest, run, score, checked, verdict)


# -- opening a bundle: a folder, a .tar.gz or a URL -------------------------------------------------------


def reference_converted_file(reference: str, group: str) -> str:
    """``reference/<ref>/converted/<group>.json``: the reference run's converted answers ``eval_preference`` read."""
    return f"{REFERENCE_DIR}/{reference}/{CONVERTED_DIR}/{group}.json"


def reference_pass_rate_file(reference: str, group: str) -> str:
    """``reference/<ref>/pass_rate/<group>_<ref>.csv``: the reference run's label table ``eval_preference`` read."""
    return f"{REFERENCE_DIR}/{reference}/{PASS_RATE_DIR}/{group}_{reference}.csv"


def _check_archive(root: Path, progress: bool) -> str:
    from stabletoolbench_mirror.upstream.archive_limits import ArchiveChanged, ArchiveError

    try:
        differences = verify(root)
    except BundleError as exc:
        raise ArchiveError(str(exc)) from exc
    if differences:
        raise ArchiveChanged("the files do not match the seal: " + "; ".join(str(d) for d in differences[:20]))
    return str(read_manifest(root)["content_hash"])


def open_bundle(spec: str, download_dir: str | os.PathLike[str], *, progress: bool = False, limits: ArchiveLimits | None = None) -> Bundle:
    """The bundle ``spec`` names (a folder, a ``.tar.gz``, or an ``http(s)://`` URL, optionally with
    ``#sha256=<hex>``), its seal checked: :class:`SealError` naming every file changed since it was sealed,
    :class:`BundleError` for one that cannot be read.

    An archive is fetched, limited (``limits``) and unpacked safely into ``download_dir`` by :mod:`..upstream.archives`
    (the code that reads snapshot archives).
    """
    from stabletoolbench_mirror.upstream.archives import ArchiveChanged, ArchiveError, ArchiveKind, local_tree

    kind = ArchiveKind((BUNDLE_FILE,), "a score bundle", "stabletoolbench-mirror score ... --out BUNDLE.tar.gz", _check_archive)
    try:
        root = local_tree(spec, download_dir, progress=progress, limits=limits, kind=kind)
    except ArchiveChanged as exc:
        raise SealError(str(exc)) from exc
    except ArchiveError as exc:
        raise BundleError(str(exc)) from exc
    differences = verify(root)
    if differences:
        shown = "\n  ".join(str(d) for d in differences[:50])
        more = f"\n  ... and {len(differences) - 50} more" if len(differences) > 50 else ""
        raise SealError(f"{root}: {len(differences)} file(s) differ from the bundle's seal:\n  {shown}{more}")
    return read_bundle(root)
