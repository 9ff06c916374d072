"""Looking after a recorded store: ``cache ls``, ``cache show``, ``cache delete`` and ``cache diff``.

``ls`` and ``delete`` stream the store (one API's keys in memory at most); ``delete`` prints what
it would remove and removes it only with ``--yes``, through :meth:`Store.delete`, so counters and
canonical pointers stay right and every server using the store stops serving the records at once.
``diff`` compares two stores, snapshots or trees one API at a time (see :mod:`.cache_diff`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from stabletoolbench_mirror.commands.cli_common import CommandError, add_config_arguments, add_json_argument, open_store, print_json
from stabletoolbench_mirror.core.keys import record_key
from stabletoolbench_mirror.core.protocol import ToolInputParseError, parse_tool_input
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.core.selection import RecordFilter, api_names
from stabletoolbench_mirror.stores import Store, StoreError

SOURCES = ("real", "simulated", "imported", "local", "model", "mcp")


def parse_date(text: str) -> float:
    """``2026-10-01`` or ``2026-10-01T12:00`` (UTC unless it names a zone) as a UNIX time."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date: give it as 2026-10-01 or 2026-10-01T12:00:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _filter_of(args: argparse.Namespace) -> RecordFilter:
    """The records the command line names (``--api``, ``--category``, ``--source``, ``--origin``, ``--key``, ``--failures``,
    ``--before``, ``--model``)."""
    apis = frozenset(name for given in args.api or () for name in api_names(given))
    return RecordFilter(apis, frozenset(args.category or ()), frozenset(args.source or ()), frozenset(getattr(args, "origin", None) or ()),
                        frozenset(getattr(args, "key", None) or ()), bool(args.failures), getattr(args, "before", None),
                        tuple(getattr(args, "model", None) or ()))


def _select(chosen: RecordFilter, store: Store) -> Iterator[Record]:
    """The matching records, streamed, grouped by API (only the named APIs are read when ``--api`` is given)."""
    source = (r for api in sorted(chosen.apis) for r in store.iter_api(api)) if chosen.apis else iter(store)
    return (record for record in source if chosen.matches(record))


def _when(created_at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created_at))


def record_line(record: Record) -> str:
    """One record as ``cache ls`` prints it: api, key, source, origin, outcome, created_at, size (tab-separated)."""
    fields = (record.api, record.key, record.source, record.origin or "-", record.outcome, _when(record.created_at), str(len(record.body.encode("utf-8", "surrogatepass"))))
    return "\t".join(f.replace("\t", " ").replace("\n", " ") for f in fields)


#: the header line of ``cache ls`` (not in ``--json`` output)
LS_HEADER = "\t".join(("api", "key", "source", "origin", "outcome", "created_at", "size"))


def record_summary(record: Record) -> dict[str, Any]:
    return {"api": record.api, "key": record.key, "source": record.source, "origin": record.origin, "outcome": record.outcome,
            "created_at": _when(record.created_at), "size": len(record.body.encode("utf-8", "surrogatepass"))}


def cmd_ls(args: argparse.Namespace) -> int:
    chosen = _filter_of(args)
    with open_store(args) as store:  # a StoreError is the command line's exit 2
        n = 0
        if not args.json:
            print(LS_HEADER)
        for record in _select(chosen, store):
            n += 1
            print(json.dumps(record_summary(record), ensure_ascii=False) if args.json else record_line(record))
    if not args.json:
        print(f"{n} records", file=sys.stderr)
    return 0


def show_keys(text: str) -> list[str]:
    """The keys ``cache show KEY`` tries: ``KEY`` as ``cache ls`` prints it, then the record key of
    ``KEY`` read as the call's JSON ``tool_input`` (``{"is_id": 7110004}`` -> ``{'is_id': 7110004}``)."""
    keys = [text]
    try:
        parsed = parse_tool_input(text)
    except ToolInputParseError:
        return keys
    converted = record_key(parsed)
    return keys if converted == text else [*keys, converted]


def shown_record(record: Record) -> dict[str, Any]:
    """One record as ``cache show`` prints it: its JSON form, the answer decoded, times as ``cache ls`` prints them."""
    data = json.loads(record.to_json())
    data["answer"] = record.answer
    data["created_at"] = _when(record.created_at)
    if isinstance(data.get("replaced"), dict) and isinstance(data["replaced"].get("created_at"), (int, float)):
        data["replaced"]["created_at"] = _when(data["replaced"]["created_at"])
    return data


def cmd_show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        for api in sorted(api_names(args.api)):
            for key in show_keys(args.key):
                record = store.get(api, key)
                if record is not None:
                    print_json(shown_record(record))
                    return 0
    raise CommandError(f"no record of {args.api} under key {args.key!r} (cache ls --api API lists its keys)", status=1)


NO_FILTER = ("error: name what to delete (--api, --category, --source, --model, --origin, --key, --before, --failures); "
             "to empty the whole store, remove it (store.path) instead")


def cmd_delete(args: argparse.Namespace) -> int:
    chosen = _filter_of(args)
    if chosen.empty:
        print(NO_FILTER, file=sys.stderr)
        return 2
    found = removed = apis = 0
    by_api: dict[str, int] = {}
    listing = not args.quiet and not args.json
    try:
        with open_store(args, read_only=not args.yes) as store:
            for api, group in groupby(_select(chosen, store), key=lambda r: r.api):
                keys = []
                for record in group:
                    if listing:
                        print(("delete\t" if args.yes else "would delete\t") + record_line(record))
                    keys.append(record.key)
                found += len(keys)
                apis += 1
                by_api[api] = by_api.get(api, 0) + len(keys)
                if args.yes:
                    removed += store.delete(api, keys)
    except StoreError as exc:
        raise CommandError(f"{exc} ({removed} records were deleted before it)") from None
    if args.json:
        print_json({"yes": bool(args.yes), "matched": found, "deleted": removed, "apis": apis, "by_api": by_api})
    elif args.yes:
        print(f"deleted {removed} records of {apis} APIs")
    else:
        print(f"{found} records of {apis} APIs would be deleted: run again with --yes to delete them")
    return 0


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", action="append", metavar="API", help="Category/tool_for_Category/api as /stats prints it, or raw category/tool/api (repeatable)")
    parser.add_argument("--category", action="append", help="standardised category (repeatable)")
    parser.add_argument("--source", action="append", choices=SOURCES, help="records of this source (repeatable)")
    parser.add_argument("--failures", action="store_true", help="failure records only")
    parser.add_argument("--model", action="append", metavar="PATTERN",
                        help="recorded model calls of this model only (fnmatch pattern, e.g. 'gpt-4*'; repeatable)")


def register_cache(cache_sub: argparse._SubParsersAction) -> None:
    """Add ``ls``, ``show``, ``delete`` and ``diff`` to the ``cache`` command group."""
    from stabletoolbench_mirror.commands.cache_diff import register_diff

    ls = cache_sub.add_parser("ls", help="list the store's records with their provenance, one line each (streamed)")
    _add_filters(ls)
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_ls)
    show = cache_sub.add_parser("show", help="one record and its provenance as JSON")
    show.add_argument("api", metavar="API", help="Category/tool_for_Category/api, or raw category/tool/api")
    show.add_argument("key", metavar="KEY", help="the record's key as cache ls prints it, or the call's JSON tool_input")
    # the record is printed as JSON either way: --json is taken, as every reporting command takes it
    show.add_argument("--json", action="store_true", help="print the record as JSON (what cache show always prints)")
    show.set_defaults(func=cmd_show)
    delete = cache_sub.add_parser("delete", help="remove records (prints what it would remove; removes only with --yes)")
    _add_filters(delete)
    delete.add_argument("--origin", action="append", help="records of this origin, as recorded or as cache stats prints it (source:origin)")
    delete.add_argument("--key", action="append", help="this exact key (repeatable)")
    delete.add_argument("--before", type=parse_date, metavar="DATE", help="records created before DATE (UTC), e.g. 2026-10-01")
    delete.add_argument("--yes", action="store_true", help="delete them (without it: only print what would go)")
    delete.add_argument("--quiet", "-q", action="store_true", help="print only the totals")
    add_json_argument(delete)
    delete.set_defaults(func=cmd_delete)
    for parser in (ls, show, delete):
        add_config_arguments(parser)
    register_diff(cache_sub)
