"""Benchmark: what one record costs to write into a diskcache store, by the kind of record.

A miss recorded by the server is one ``Store.add``; its cost should not depend on how many entries
the store already holds.  Three kinds are timed, since they update different counters: an answer of
an API the store knows, the first answer of an API (one more counter), and a failure record (one
more again).  Until issue 24's fourth round the last two read every row of the table (SQLite chose
the ``expire_time`` index for the counters' lookup once it had five keys): 135 ms each at 165k
entries, holding the store's write lock all that time.

With each kind it also counts the SQL statements of one write (``statements_<kind>``: SQLite's
trace, a run of one text counted once; a new record took 11 after issue 24's third round, the
one-by-one path 17), the cost checks that used to be tests.

The records are written into ``STORE`` (use a copy of a store you keep); prints the median
milliseconds of each kind as one JSON line, or a table with ``--table``::

    python benchmarks/store_writes.py STORE [--n 30] [--table] [--checkout DIR]

``--checkout DIR`` times another checkout's store code (its package imported instead of this one's).

``benchmarks/scale.py`` runs it on a copy of the imported tree's store and of a 1,000-entry store.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

KINDS = ("known_api", "new_api", "failure")


def _checkout(argv: list[str]) -> str:
    """The checkout whose package is timed: ``--checkout DIR``, else this one (read before the imports below)."""
    for i, arg in enumerate(argv):
        if arg == "--checkout" and i + 1 < len(argv):
            return str(Path(argv[i + 1]).resolve())
        if arg.startswith("--checkout="):
            return str(Path(arg.split("=", 1)[1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _checkout(sys.argv[1:]))

from stabletoolbench_mirror.core.records import Record  # noqa: E402
from stabletoolbench_mirror.stores.diskcache_store import DiskcacheStore  # noqa: E402


def _record(kind: str, tag: str, api: str) -> Record:
    if kind == "known_api":
        return Record.from_answer(api, f"{{'bench': '{tag}'}}", {"error": "", "response": "written by store_writes"}, "simulated", "bench")
    if kind == "new_api":
        return Record.from_answer(f"Bench/writes_{tag}_for_Bench/api", "{}", {"error": "", "response": "new API"}, "simulated", "bench")
    return Record.failure(api, f"{{'failed': '{tag}'}}", {"error": "bench", "response": ""}, "simulated", "bench",
                          reason="store_writes", tried=("simulated:bench",))


def statements(store: DiskcacheStore, record: Record) -> int:
    """The SQL statements one ``add`` of ``record`` runs (diskcache's connection traced: a benchmark's look inside)."""
    import itertools

    seen: list[str] = []
    con = store._cache._con  # noqa: SLF001 - the benchmark counts what the store sends SQLite
    con.set_trace_callback(seen.append)
    try:
        store.add(record, "canonical")
    finally:
        con.set_trace_callback(None)
    return len([text for text, _ in itertools.groupby(seen)])


def measure(path: Path, n: int) -> dict[str, float]:
    """Median milliseconds per ``add`` of each kind, ``n`` of each, interleaved; the statements of one more of each."""
    store = DiskcacheStore(path)
    try:
        known = next((r.api for r in store), "Bench/known_for_Bench/api")  # an API the store holds
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(n):
            for kind in KINDS:
                record = _record(kind, uuid.uuid4().hex[:12], known)
                started = time.perf_counter()
                added = store.add(record, None)
                times[kind].append((time.perf_counter() - started) * 1000)
                if not added:
                    raise SystemExit(f"a {kind} record was not added: is {path} a store in use?")
        result = {kind: statistics.median(values) for kind, values in times.items()}
        for kind in KINDS:
            result[f"statements_{kind}"] = statements(store, _record(kind, uuid.uuid4().hex[:12], known))
        return result
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", type=Path, help="a diskcache store folder (records are added to it)")
    ap.add_argument("--n", type=int, default=30, help="records of each kind")
    ap.add_argument("--table", action="store_true", help="a table instead of one JSON line")
    ap.add_argument("--checkout", help="another checkout (its repository root) whose store code is timed")
    args = ap.parse_args()
    if not (args.store / "cache.db").is_file():
        raise SystemExit(f"{args.store} is not a diskcache store (no cache.db): make one with `cache import`")
    result = measure(args.store, args.n)
    if args.table:
        for kind in KINDS:
            print(f"{kind:<10} median {result[kind]:.2f} ms  {result[f'statements_{kind}']:.0f} statements")
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
