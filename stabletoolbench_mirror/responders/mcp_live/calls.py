"""The path of one live MCP tool call: occurrence, store, the live server, the simulator, record, count.

``mcp_servers`` (:class:`~stabletoolbench_mirror.config.McpServerConfig`) names live MCP servers; ``/mcp``
offers their tools (:mod:`.tools`) and answers each ``tools/call`` here, the way ``/virtual`` answers a tool
call and ``/v1`` a model call, in the same store, with the same provenance and counts:

1. the call's key (:func:`~.tools.call_digest`; with ``matcher: by-order`` the occurrence number claimed in
   the run, :class:`~stabletoolbench_mirror.engine.occurrences.RunCounters`, as model calls claim theirs: the
   n-th identical call of a run gets the n-th answer; a run is the MCP session's server session, else the server's own run);
2. the store: a record is served as recorded (a failure record too, except in ``record`` mode with the
   server live, which asks again; a usable answer then replaces it, the store's rule);
3. ``replay``: a call not recorded is an error result naming it; nothing is asked, nothing recorded;
4. ``record``/``refresh``: the live server (``live: true``), whose ``CallToolResult`` (an ``isError`` one too:
   it is what the server answers) is recorded with ``source: mcp``;
5. the server down (or ``live: false``): the simulator, from the tool's recorded schema (:mod:`.simulate`),
   recorded with ``source: simulated``; without one, an error result naming the server that is down,
   recorded as a failure record (replayed as served);
6. ``faults:`` (seeded) may serve a fault in its place (:meth:`~stabletoolbench_mirror.engine.faults.FaultPlan.mcp_kind`);
7. counted once in ``/stats`` (``requests``, outcomes, ``by_source``, per API ``@mcp/<server>/<tool>``).

``tools/list`` of each server is read at start: live in ``record``/``refresh`` (and recorded when it
differs from the record), else from the store.  Blocking work (store, servers, simulator) runs in worker threads.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio.to_thread
from cachetools import LRUCache

from stabletoolbench_mirror.config import McpServerConfig, Mode
from stabletoolbench_mirror.core.outcomes import Outcome, OutcomeKind
from stabletoolbench_mirror.core.protocol import encode_answer
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.faults import FaultPlan, mcp_faulted
from stabletoolbench_mirror.engine.occurrences import PrivateRun, RunCounters
from stabletoolbench_mirror.responders.mcp_live.client import LiveServer, LiveServerDown
from stabletoolbench_mirror.responders.mcp_live.drift import ServerDrift, schema_drift
from stabletoolbench_mirror.responders.mcp_live.simulate import result_text, simulate
from stabletoolbench_mirror.responders.mcp_live.tools import (
    LISTING_KEY,
    LiveTool,
    call_digest,
    call_key,
    drift_record,
    listed_tools,
    listing_api,
    listing_record,
    offered_tools,
)
from stabletoolbench_mirror.responders.simulator.responder import Simulator
from stabletoolbench_mirror.stores.base import CacheTier, Store, StoreError

log = logging.getLogger(__name__)

#: the earlier calls of a run shown to the simulator
HISTORY_CALLS = 8
#: runs whose earlier calls are kept (the least recently used forgotten beyond it)
HISTORY_RUNS = 1024
#: occurrences counted in this process's memory (of local runs, the MCP sessions it holds), all runs together: the
#: least recently used run is forgotten beyond it; a run holding half of it counts its new calls in the store
LOCAL_COUNTS = 200_000


def error_result(message: str) -> dict[str, Any]:
    """An MCP error result of this server's own: one text content, ``isError``."""
    return {"content": [{"type": "text", "text": message}], "isError": True}


class LiveCalls:
    """Answers ``tools/call`` of the live MCP servers' tools (see the module's docstring)."""

    def __init__(self, servers: Mapping[str, McpServerConfig], store: Store, *, mode: Mode, stats: Any, run: str,
                 frozen: Sequence[CacheTier] = (), simulator: Simulator | None = None, save: bool = True,
                 store_timeout_s: float = 2.0, limiter: Any = None, redactor: Redactor | None = None,
                 faults: FaultPlan | None = None) -> None:
        """``frozen``: read after the store, in order (a snapshot of a recorded run replays it alone); ``faults``: the seeded
        faults served instead of some answers (:meth:`~.FaultPlan.mcp_kind`), after the clean answer was recorded."""
        self.configs = dict(servers)
        self.live = {name: LiveServer(name, cfg) for name, cfg in servers.items()}
        self.store = store
        self.frozen = tuple(frozen)
        self.redactor = redactor or Redactor()
        """Configured keys: masked in what is recorded (a server may echo its key)."""
        self.mode = mode
        self.stats = stats
        self.run = run
        self.simulator = simulator
        self.save = save
        self.limiter = limiter
        self.faults = faults
        self.counters = RunCounters(store, PrivateRun(run), store_timeout_s)
        self.tools: dict[str, LiveTool] = {}
        self.listed_at: dict[str, float | None] = {}
        self._history: LRUCache[str, deque[tuple[str, Any, str]]] = LRUCache(HISTORY_RUNS)
        self._local: LRUCache[str, dict[str, int]] = LRUCache(LOCAL_COUNTS, getsizeof=lambda counts: len(counts) + 1)
        """Per local run, each call's last occurrence number (a run's MCP session lives in this process only)."""

    # -- start and stop ---------------------------------------------------------------------------

    def start(self) -> None:
        """Read every server's listing (the live ones in parallel) and the tools offered from them: the servers in the
        order of their names (whatever order a config or a snapshot's manifest gives them), each one's tools in its own."""
        names = sorted(self.configs)
        with ThreadPoolExecutor(max(1, min(8, len(names)))) as pool:
            listings = dict(zip(names, pool.map(self._listing, names)))
        self.tools = offered_tools(listings)
        log.info("live MCP servers: %d, tools offered: %d", len(listings), len(self.tools))

    def _asks_live(self, server: str) -> bool:
        return self.mode is not Mode.REPLAY and self.configs[server].live

    def _lookup(self, api: str, key: str) -> Record | None:
        """The record of ``key``: the store's, else the first frozen cache's that holds it."""
        for tier in (self.store, *self.frozen):
            try:
                found = tier.get(api, key)
            except StoreError as exc:
                log.warning("live MCP: %s cannot be read (%s)", api[:200], exc)
                continue
            if found is not None:
                return found
        return None

    def _listing(self, server: str) -> list[dict[str, Any]]:
        recorded = self._lookup(listing_api(server), LISTING_KEY)
        if self._asks_live(server):
            try:
                tools = self.live[server].list_tools()
            except LiveServerDown as exc:
                log.warning("%s; its recorded tools/list is offered", exc)
            else:
                fresh = listing_record(server, tools)
                if self.save and (recorded is None or listed_tools(recorded) != tools):
                    try:
                        self.store.replace(fresh, None)
                        if recorded is not None:  # the server's tools changed since the recorded listing: its drift kept
                            changed = ServerDrift(server, schema=schema_drift(listed_tools(recorded), tools))
                            log.warning("MCP server %r: its tools/list changed since it was recorded: %s", server,
                                        "; ".join(f"{t}: {', '.join(f)}" for t, f in changed.schema.items())[:500])
                            self.store.add(drift_record(server, changed.to_json(), "record"), None)
                    except StoreError as exc:
                        log.warning("MCP server %r: its tools/list is not recorded (%s)", server, exc)
                self.listed_at[server] = fresh.meta["listed_at"] if fresh.meta else None
                return tools
        if recorded is None:
            log.warning("MCP server %r: no tools/list is recorded and the server is not asked (mode %s): none of its tools "
                        "is offered", server, self.mode)
            return []
        self.listed_at[server] = (recorded.meta or {}).get("listed_at")
        return listed_tools(recorded)

    def close(self) -> None:
        for server in self.live.values():
            server.close()
        self.counters.close()

    # -- one call -------------------------------------------------------------------------------

    def _claim_local(self, run: str, digest: str) -> int | None:
        """``digest``'s next number in a local run, counted in memory; ``None`` when the store counts it."""
        counts = self._local.get(run)
        if counts is None:
            counts = {}
        elif digest not in counts and len(counts) >= LOCAL_COUNTS // 2:
            return None
        number = counts.get(digest, 0) + 1
        counts[digest] = number
        self._local[run] = counts  # its size counted again (the least recently used runs forgotten beyond the bound)
        return number

    def _release_local(self, run: str, digest: str, number: int) -> bool:
        counts = self._local.get(run)
        if counts is None or digest not in counts:
            return False
        if counts[digest] == number:
            counts[digest] = number - 1
        return True

    async def _claim(self, run: str, digest: str, local: bool) -> int:
        number = self._claim_local(run, digest) if local else None
        return number if number is not None else await self.counters.claim(run, digest)

    async def _release(self, run: str, digest: str, number: int, local: bool) -> None:
        if not (local and self._release_local(run, digest, number)):
            await self.counters.release(run, digest, number)

    async def call(self, offered: str, arguments: dict[str, Any], run: str | None = None, local: bool = False) -> str | None:
        """The ``CallToolResult`` (its JSON text, as recorded) of a call of an offered tool, counted; ``None`` when no
        tool has that name.  ``local``: ``run`` is an MCP session of this process (its occurrences counted in memory)."""
        tool = self.tools.get(offered)
        if tool is None:
            return None
        config, run = self.configs[tool.server], run or self.run
        api = tool.api
        digest = call_digest(tool.name, arguments, config.ignore_fields)
        number = 0
        if config.matcher == "by-order":
            try:
                number = await self._claim(run, digest, local and run != self.run)
            except StoreError as exc:
                refused = Outcome.error(503, f"the store cannot count this call's occurrence: {exc}", OutcomeKind.STORE_ERROR)
                self.stats.count(refused)
                return encode_answer(error_result(f"stabletoolbench-mirror: {refused.answer['error']}"))
        outcome: Outcome | None = None
        key = call_key(digest, number)
        try:
            hit = self._store_hit(api, key, tool.server)
            if hit is not None:  # a local store's hit, on the event loop (as /virtual's hits)
                outcome = self._outcome(hit, OutcomeKind.HIT, api)
            else:
                _, outcome = await anyio.to_thread.run_sync(self._answer, tool, arguments, api, key, run, limiter=self.limiter)
        except Exception:
            log.exception("live MCP call of %s failed", api[:200])
        finally:
            if number and (outcome is None or outcome.kind is OutcomeKind.UNANSWERED):
                await self._release(run, digest, number, local and run != self.run)
        if outcome is None:
            outcome = Outcome(encode_answer(error_result("stabletoolbench-mirror: internal error (see the server log)")),
                              OutcomeKind.ERROR, status=500, api=api)
        earlier = self._history.get(run)
        if earlier is None:
            earlier = self._history[run] = deque(maxlen=HISTORY_CALLS)
        earlier.append((tool.offered, arguments, outcome.body))  # the result's text read only if a simulation needs it
        outcome = await self._faulted(tool, key, outcome)
        self.stats.count(outcome)
        return outcome.body

    async def _faulted(self, tool: LiveTool, key: str, outcome: Outcome) -> Outcome:
        """``outcome``, or the seeded fault served in its place (served only: the store and the simulator's history
        keep the clean result)."""
        plan = self.faults
        if plan is None or (fault := plan.mcp_kind(tool.server, tool.name, tool.api, key, outcome)) is None:
            return outcome
        if fault == "slow":
            await anyio.sleep(plan.slow_s)
        return dataclasses.replace(outcome, body=mcp_faulted(outcome.body, fault), fault=fault)

    def _store_hit(self, api: str, key: str, server: str) -> Record | None:
        """The store's record of ``key`` when it is served as it is and the store reads without waiting; else ``None``
        (the worker thread looks again, and in the frozen caches)."""
        if self.store.reads_wait or self.mode is Mode.REFRESH:
            return None
        try:
            found = self.store.get(api, key)
        except StoreError:
            return None
        return found if found is not None and not (found.is_failure and self._asks_live(server)) else None

    def _answer(self, tool: LiveTool, arguments: dict[str, Any], api: str, key: str, run: str) -> tuple[dict[str, Any], Outcome]:
        """The result and outcome of one call (in a worker thread)."""
        found = self._lookup(api, key) if self.mode is not Mode.REFRESH else None
        asks_live = self._asks_live(tool.server)
        if found is not None and not (found.is_failure and asks_live):
            return found.answer, self._outcome(found, OutcomeKind.HIT, api)
        if self.mode is Mode.REPLAY:
            message = (f"stabletoolbench-mirror: MCP server {tool.server!r}, tool {tool.name!r}: this call ({key}) is not "
                       f"recorded, and in replay mode nothing is asked (run {run!r}); record it with mode: record")
            return error_result(message), Outcome(encode_answer(error_result(message)), OutcomeKind.UNANSWERED, api=api)
        problem = f"mcp_servers.{tool.server}.live is false"
        if asks_live:
            started = time.perf_counter()
            try:
                result = self.live[tool.server].call(tool.name, arguments)
            except LiveServerDown as exc:
                problem = str(exc)
            else:
                meta = {**self._call_meta(tool, arguments, run), "latency_s": round(time.perf_counter() - started, 6)}
                record = Record.from_answer(api, key, self.redactor.data(result), "mcp", f"mcp:{tool.server}", meta=meta)
                return self._write(record, found, api, ())
        tried = [f"mcp:{tool.server}"] if asks_live else []
        if self.simulator is not None:
            earlier = [(name, args, result_text(body)) for name, args, body in self._history.get(run) or ()]
            simulated = simulate(self.simulator, tool, arguments, earlier)
            tried.append(f"simulated:{self.simulator.origin}")
            if simulated.result is not None:
                meta = {**(simulated.meta or {}), **self._call_meta(tool, arguments, run), "server_down": problem}
                record = Record.from_answer(api, key, simulated.result, "simulated", self.simulator.origin, meta=meta)
                return self._write(record, found, api, (problem,))
            problem = f"{problem}; {simulated.detail}"
        else:
            problem += "; no simulator answers in its place (simulator.enabled)"
        result = error_result(f"stabletoolbench-mirror: {problem}")
        failure = Record.failure(api, key, result, "mcp", f"mcp:{tool.server}", reason=problem, tried=tuple(tried))
        failure = dataclasses.replace(failure, meta=self._call_meta(tool, arguments, run))
        return self._write(failure, found, api, (problem,))

    def _call_meta(self, tool: LiveTool, arguments: dict[str, Any], run: str) -> dict[str, Any]:
        """What a call's record keeps beside its answer: the call itself (for ``mcp-verify``, keys masked), its run, the listing's time."""
        return {"tool": tool.name, "arguments": self.redactor.data(arguments), "run": run, "listed_at": self.listed_at.get(tool.server)}

    def _write(self, record: Record, found: Record | None, api: str, problems: tuple[str, ...]) -> tuple[dict[str, Any], Outcome]:
        """Record ``record`` (add-if-absent: when another call recorded this key first, its answer is served)."""
        kind = OutcomeKind.FAILED if record.is_failure else OutcomeKind.REPLACED if found is not None else OutcomeKind.RECORDED
        if not self.save:
            kind = OutcomeKind.FAILED if record.is_failure else OutcomeKind.UNRECORDED
        else:
            try:
                if self.mode is Mode.REFRESH and not record.is_failure:
                    self.store.replace(record, None)
                elif not self.store.add(record, None):
                    kept = self.store.get(record.api, record.key)
                    if kept is not None and kept.body != record.body:
                        return kept.answer, self._outcome(kept, OutcomeKind.HIT, api)
            except StoreError as exc:
                log.warning("live MCP call: not recorded (%s); served all the same", exc)
                kind = OutcomeKind.FAILED if record.is_failure else OutcomeKind.UNRECORDED
        outcome = Outcome(record.body, kind, source=record.source, origin=record.origin, api=api, problems=problems,
                          failure=record.is_failure, new_failure_record=record.is_failure and found is None,
                          retried=found is not None and found.is_failure)
        return record.answer, outcome

    @staticmethod
    def _outcome(record: Record, kind: OutcomeKind, api: str) -> Outcome:
        return Outcome(record.body, kind, source=record.source, origin=record.origin, api=api, failure=record.is_failure)
