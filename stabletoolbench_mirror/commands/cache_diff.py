"""``cache diff A B``: what changed between two stores, snapshots or trees (:mod:`stabletoolbench_mirror.snapshots.tree_diff`).

Exit status: 0 the same, 1 different, 2 an error.
"""

from __future__ import annotations

import argparse

from stabletoolbench_mirror.commands.cli_common import CommandError, add_config_arguments, print_json, settings_from_args


def cmd_diff(args: argparse.Namespace) -> int:
    from stabletoolbench_mirror.snapshots.tree_diff import DiffError, diff, open_side

    try:
        settings = settings_from_args(args)
        progress = not (args.quiet or args.json)
        with open_side(args.a, settings, progress=progress, desc="A") as a, open_side(args.b, settings, progress=progress, desc="B") as b:
            result = diff(a, b, show=args.show)
    except DiffError as exc:  # a StoreError is the command line's exit 2
        raise CommandError(str(exc)) from None
    if args.json:
        print_json(result.to_json(args.a, args.b))
    else:
        print("\n".join(result.lines(args.a, args.b)))
    return 0 if result.same else 1


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of keys (0 or more)")
    return value


def register_diff(cache_sub: argparse._SubParsersAction) -> None:
    parser = cache_sub.add_parser(
        "diff", help="compare two stores, snapshots or trees: keys added, removed and changed per API (exit 0 same, 1 different, 2 error)"
    )
    parser.add_argument("a", metavar="A", help="'store' (the configured one), a diskcache folder, redis://...[#prefix=P], a snapshot or tree folder, or a snapshot archive / URL")
    parser.add_argument("b", metavar="B", help="the same kinds as A")
    parser.add_argument("--json", action="store_true", help="print an object with added, removed, changed and by_api")
    parser.add_argument("--show", type=_count, default=5, metavar="N", help="show the first N changed keys with both answers (default 5)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_config_arguments(parser)
    parser.set_defaults(func=cmd_diff)

