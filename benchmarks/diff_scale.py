"""``cache diff`` memory at scale: two trees of N entries compared, against ``cache export``'s bound.

Generates a tree of ``--entries`` entries over ``--files`` API files (``benchmarks/make_tree.py``),
makes a second tree from it with 3 answers changed (hard links for the files left alone), imports
the first into a diskcache store, then measures, each in its own process, seconds and peak RSS of:

* ``cache export`` of the store (the memory bound: one API in memory at a time);
* ``cache ls`` of every record (streamed) and ``cache diff STORE STORE`` (the same: exit 0);
* ``cache diff TREE_A TREE_B`` (two trees) and ``cache diff STORE TREE_B`` (a store and a tree),
  checking that each reports 0 added, 0 removed, 3 changed and exits 1.

    python benchmarks/diff_scale.py [--entries 1000000] [--files 10000] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import cli, timed_rss  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def make_tree(workdir: Path, entries: int, files: int) -> Path:
    out = workdir / f"tree-{entries}"
    if not (out / "tree.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_tree.py"), str(out), "--entries", str(entries), "--files", str(files),
                        "--samples", "10", "--check-samples", "10", "-q"], check=True)
    return out / "tool_response_cache"


def changed_copy(tree: Path, out: Path, changes: int = 3) -> None:
    """``tree`` as hard links, with ``changes`` answers (in the largest files) rewritten."""
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(["cp", "-al", str(tree), str(out)], check=True)
    files = sorted(out.rglob("*.json"), key=lambda p: -p.stat().st_size)[:changes]
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        key = next(iter(data))
        data[key] = {"error": "", "response": "changed by diff_scale.py"}
        path.unlink()  # break the hard link: the first tree keeps its file
        path.write_text(json.dumps(data, indent=4, ensure_ascii=False), encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--workdir", help="keep generated trees here (reused by later runs); default a temporary folder")
    ap.add_argument("--keep", action="store_true", help="do not delete the temporary folder")
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="stm-diff-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        tree_a = make_tree(workdir, args.entries, args.files)
        tree_b = workdir / f"changed-{args.entries}"
        changed_copy(tree_a, tree_b)
        store = workdir / f"store-{args.entries}"
        if not (store / "cache.db").is_file():
            timed_rss(cli("cache", "import", str(tree_a), "--store-path", str(store), "-q"), cwd=workdir)
        export = workdir / "export"
        shutil.rmtree(export, ignore_errors=True)
        rows = {"cache export": timed_rss(cli("cache", "export", str(export), "--store-path", str(store), "-q"), cwd=workdir)}
        shutil.rmtree(export, ignore_errors=True)
        seconds, rss, out = timed_rss(cli("cache", "diff", str(store), str(store), "--json", "-q"), cwd=workdir)
        assert json.loads(out)["same"] is True
        rows["cache diff store store (the same: exit 0)"] = (seconds, rss, "")
        for name, a in (("cache diff tree tree", str(tree_a)), ("cache diff store tree", str(store))):
            seconds, rss, out = timed_rss(cli("cache", "diff", a, str(tree_b), "--json", "-q"), cwd=workdir, ok_codes=(1,))
            report = json.loads(out)
            assert (report["added"], report["removed"], report["changed"]) == (0, 0, 3), report
            rows[name] = (seconds, rss, out)
        # last: its output (a line per record) is read into this process, and a child forked after that
        # would count this process's pages in its own peak RSS until it execs
        seconds, rss, out = timed_rss(cli("cache", "ls", "--store-path", str(store)), cwd=workdir)
        assert out.count("\n") == args.entries
        rows["cache ls (every record)"] = (seconds, rss, "")
        print(f"{args.entries:,} entries over {args.files:,} files (CPUs: {os.cpu_count()})")
        print("| command | seconds | peak RSS |\n|---|---|---|")
        for name, (seconds, rss, _out) in rows.items():
            print(f"| `{name}` | {seconds:.1f} | {rss:.0f} MB |")
    finally:
        if not (args.workdir or args.keep):
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
