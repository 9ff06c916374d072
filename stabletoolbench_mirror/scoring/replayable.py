"""Whether a bundle's records replay: every recorded model call's occurrences are numbered 1, 2, ... n, no gap.

A replay counts identical requests from 1 in each model-call run (docs/model-calls.md, Occurrences) and
finds the n-th one's answer under ``<digest>#<n>``.  A record whose request has no ``#1`` (a record run that
met an earlier run's occurrence counters and was answered #2-#4), or a gap (``#1``, ``#3``), can never be
reached that way: its replay stops at "occurrence 1 is not recorded".  :func:`problems` finds them in a
records tree (``records/``, a snapshot), and :func:`..bundle.seal` refuses to seal such a bundle.

Tool answers are keyed by their call, not counted: they are not checked here.
"""

from __future__ import annotations

from pathlib import Path

from stabletoolbench_mirror.core.model_calls import MODEL_CATEGORY, split_key
from stabletoolbench_mirror.upstream.layout import read_cache_file

#: the requests named in the message when many are wrong
SHOWN = 5


def problems(records: Path) -> list[str]:
    """One line for each model API file of ``records`` whose occurrences of some request are not exactly 1..n
    (or that cannot be read); empty when every recorded model call replays."""
    folder = records / MODEL_CATEGORY
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.rglob("*.json")):
        relative = path.relative_to(records.parent).as_posix()
        try:
            entries = read_cache_file(path)
        except (OSError, ValueError) as exc:
            out.append(f"{relative}: cannot be read ({exc})")
            continue
        wrong = _gaps(entries)
        if wrong:
            shown = "; ".join(f"request sha256:{digest[:16]}... is recorded as {_numbers(held)}, without {_numbers(_missing(held))}"
                              for digest, held in wrong[:SHOWN])
            more = f" (and {len(wrong) - SHOWN} more requests)" if len(wrong) > SHOWN else ""
            out.append(f"{relative}: {shown}{more}")
    return out


def _gaps(entries: dict[str, object]) -> list[tuple[str, list[int]]]:
    """``(digest, its occurrences)`` of each request whose occurrences are not 1..n, by digest."""
    held: dict[str, list[int]] = {}
    for key in entries:
        parts = split_key(key)
        if parts is not None:
            held.setdefault(parts[0], []).append(parts[1])
    return [(digest, sorted(numbers)) for digest, numbers in sorted(held.items()) if sorted(numbers) != list(range(1, len(numbers) + 1))]


def _missing(numbers: list[int]) -> list[int]:
    return sorted(set(range(1, max(numbers) + 1)) - set(numbers))


def _numbers(numbers: list[int]) -> str:
    return ", ".join(f"#{n}" for n in numbers[:10]) + (", ..." if len(numbers) > 10 else "")
