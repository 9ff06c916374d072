"""Offline cache warming: fill the store with the calls a benchmark run will make, before it runs.

Inputs (:mod:`.inputs`), by *input kind*:

* ``queries``: StableToolBench query files or folders; one *default call* per API of each
  query's ``api_list`` (see :mod:`stabletoolbench_mirror.upstream.queries` for how the agent's own
  default call is keyed and typed);
* ``answers``: StableToolBench / ToolBench answer files or folders; every call the agent
  made (see :mod:`stabletoolbench_mirror.upstream.answers`);
* ``payloads``: JSONL of ``/virtual`` bodies (or ``{"payload": ...}`` lines, such as the
  failures file a previous ``warm`` wrote).

Each call found has a *location* (``file#query_id/api``, ``file:path.in.file``, ``file:line``).
Identical calls are made once (:mod:`.plan`).  Calls already answered by the store or a
frozen cache are skipped, so an interrupted run resumes where it stopped: each answer is
recorded the moment it arrives (an atomic add-if-absent), and a killed run leaves no partial
entry.  The rest go through :meth:`MirrorLayer.handle_call` (the server's own real API ->
simulator chain) with ``--concurrency`` calls in flight, in threads of this process
(:mod:`.runner`) or of ``--processes`` worker processes (:mod:`.pool`); with
``--engine vllm-offline`` the simulator's prompts go to vLLM's in-process engine in batches
(:mod:`.offline`, imported only then).  Failures are listed (and written with ``--failures``),
never recorded.  The command line is :mod:`stabletoolbench_mirror.commands.warm`.
"""
