"""``stabletoolbench-mirror faults profile TREE``: the real mix of failures in a cache tree, printed as a YAML ``faults:``
block the settings accept (with ``--json``: the counts too), a progress bar while the files are read.

What is counted and how: :mod:`stabletoolbench_mirror.upstream.fault_profile`.
"""

from __future__ import annotations

import argparse
import sys

from stabletoolbench_mirror.commands.cli_common import CommandError, add_command, add_json_argument, print_json
from stabletoolbench_mirror.upstream.fault_profile import profile_tree
from stabletoolbench_mirror.upstream.trees import frozen_cache_problem


def cmd_faults_profile(args: argparse.Namespace) -> int:
    """Count a tool_response_cache tree's answers by fault kind (StableToolBench's error answers, empty answers) and print
    a faults: block with that rate and mix, to paste into server_config.yml."""
    problem = frozen_cache_problem(args.tree, follow_symlinks=args.allow_symlinks)
    if problem is not None:
        raise CommandError(problem)
    profile = profile_tree(args.tree, progress=not args.quiet, allow_symlinks=args.allow_symlinks)
    for path in profile.unreadable[:20]:
        print(f"skipped (cannot be read): {path}", file=sys.stderr)
    if args.json:
        print_json(profile.as_json(args.tree, args.seed))
        return 0
    print(profile.render(args.tree, args.seed))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    faults = sub.add_parser("faults", help="injected faults (see docs/faults.md)")
    faults_sub = faults.add_subparsers(dest="faults_command", required=True)
    profile = add_command(faults_sub, "profile", cmd_faults_profile, summary="print the share of each error answer among a cache tree's answers, as a faults: block")
    profile.add_argument("tree", help="an upstream tool_response_cache tree (e.g. StableToolBench's server/tool_response_cache)")
    profile.add_argument("--seed", type=int, default=0, help="the seed written in the block (default 0)")
    profile.add_argument("--allow-symlinks", action="store_true", help="follow symbolic links that lead out of the tree")
    profile.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_json_argument(profile)
