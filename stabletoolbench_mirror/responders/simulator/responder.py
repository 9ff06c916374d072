"""The simulator as a miss responder: tool doc + prompt -> chat completion -> parsed answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.fair import FairSemaphore
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.records import Record, Source
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.responders import Attempt
from stabletoolbench_mirror.engine.stats import LocalEvents, event_section
from stabletoolbench_mirror.responders.simulator import history, prompts
from stabletoolbench_mirror.responders.simulator.client import ChatClient, ChatError, Completion
from stabletoolbench_mirror.responders.simulator.parsing import Parsed, parse_output
from stabletoolbench_mirror.responders.simulator.prompt_files import SystemPrompt, built_in_prompt
from stabletoolbench_mirror.upstream.tooldocs import ToolDocs
from stabletoolbench_mirror.upstream.validity import classify

#: longest rationale kept on a record (characters)
MAX_RATIONALE_CHARS = 100_000

log = logging.getLogger(__name__)


class Simulator:
    """Answers a cache miss with a simulated response (recorded with ``source: simulated``).

    * a parsed answer that passes the validity rules (``validity``) -> ``Attempt(answer,
      origin=<model>)``, recorded by the layer;
    * unparsable output -> no answer, fallback ``Failed to generate fake response`` (served and
      recorded as a failure record, so a later call may try again);
    * an incomplete completion (``finish_reason`` ``length``, ``content_filter``, ``tool_calls``,
      missing, ...: see :func:`incomplete`) -> the same, even when its text parses: a JSON object
      the tolerant extractor closes after a cut is not the answer the model meant;
    * a parsed answer the validity rules reject (``{"error": "Rate limit exceeded"}``,
      ``"Unauthorized error..."``) -> no answer, fallback the parsed answer itself;
    * no completion at all (connection refused, timeout, HTTP 5xx/429 after the retries) ->
      no answer and no fallback: the layer serves its "API not working" miss answer.
    """

    source: Source = "simulated"

    def __init__(
        self,
        client: ChatClient,
        *,
        style: str = "mirrorapi-sft",
        system_prompt: SystemPrompt | None = None,
        docs: ToolDocs | None = None,
        max_examples: int = 5,
        structured_output: bool = False,
        structured_max_chars: int | None = None,
        max_concurrency: int = 64,
        parse_retries: int = 0,
        redactor: Redactor | None = None,
        origin_suffix: str = "",
        validity: str = "strict",
    ) -> None:
        if style not in prompts.STYLES:
            raise ValueError(f"unknown simulator style {style!r}")
        self.client = client
        self.style = style
        self.prompt = built_in_prompt(style) if system_prompt is None else system_prompt
        self.system_prompt = self.prompt.text
        self.parse_retries = max(0, int(parse_retries))
        """Further completions asked for when an output cannot be parsed (seed + 1, + 2, ...)."""
        self.docs = docs
        self.max_examples = max_examples
        self.extra: dict[str, Any] = (
            prompts.structured_output_fields(style == "mirrorapi-cot", structured_max_chars) if structured_output else {}
        )
        self._slots = FairSemaphore(max_concurrency)  # shared fairly between the server's clients
        self._events: Any = LocalEvents()
        self.redactor = redactor or Redactor()
        """Configured keys: an endpoint may echo its key (its ``Authorization`` header) into an answer."""
        self.origin_suffix = origin_suffix
        """Marks the records' origin, e.g. `` [no tool docs]`` when simulating without any doc."""
        if validity not in VALIDITY_RULES:
            raise ValueError(f"unknown simulator validity rules {validity!r}")
        self.validity = validity

    @property
    def origin(self) -> str:
        """What the records name as their origin: the model (never the endpoint's key)."""
        return self.client.model + self.origin_suffix

    @property
    def wants_examples(self) -> bool:
        return self.style == "gpt-fewshot" and self.max_examples > 0

    def messages(self, call: ToolCall, examples: Sequence[Record] = ()) -> list[dict[str, str]]:
        """The chat messages this simulator sends for ``call``.

        Inside a session, ``gpt-fewshot`` and ``world-model`` also carry the task and the last
        calls of the session (:mod:`.history`); MirrorAPI styles never do.
        """
        doc = self.docs.find(call.names) if self.docs is not None else None
        if self.style == "world-model":
            return history.world_model_messages(self.system_prompt, call, doc)
        if self.style == "gpt-fewshot":
            return history.with_session(
                call, prompts.gpt_fewshot_messages(self.system_prompt, call, doc, examples, max_examples=self.max_examples)
            )
        return prompts.mirrorapi_messages(self.system_prompt, call, doc, self.style)

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        messages = self.messages(call, examples)
        redactor = self.redactor.plus(call.toolbench_key)
        retries = 0
        while True:
            extra = self.extra
            seed = self.client.seed
            if retries and seed is not None:
                # the same seed at the same temperature would give the same output again
                seed = seed + retries
                extra = {**self.extra, "seed": seed}
            started = time.perf_counter()
            with self._slots:
                try:
                    completion = self.client.complete(messages, extra)
                except ChatError as exc:
                    log.warning("simulator gave no answer for %s: %s", clip(call.api), clip(exc.detail, 500))
                    return Attempt(None, self.origin, detail=f"simulator unavailable: {exc.detail}")
            latency = time.perf_counter() - started
            cut = incomplete(completion.finish_reason)
            if cut is not None:
                # Not asked again, even with parse_retries (which is for output the parser cannot
                # read): the same prompt at the same max_tokens is cut again (at temperature 0 token
                # for token; above it a runaway answer mostly runs away again), every try costs a
                # full max_tokens generation, and the failure record is asked again by the next
                # identical call in record mode anyway.
                log.warning(
                    "simulator output for %s is incomplete (finish_reason %s, %d chars): %r",
                    clip(call.api),
                    clip(completion.finish_reason or "missing", 40),
                    len(completion.content),
                    redactor.text(completion.content[:300]),
                )
                return Attempt(None, self.origin, detail=cut, fallback=protocol.simulation_failed_answer())
            parsed = parse_output(completion.content)
            if parsed.answer is not None or retries >= self.parse_retries:
                break
            retries += 1
            self._count_retry()
            log.info("simulator output for %s cannot be parsed; asking again (%d/%d)", clip(call.api), retries, self.parse_retries)
        if parsed.answer is None:
            log.warning(
                "simulator output for %s cannot be parsed (finish_reason %s, %d chars): %r",
                clip(call.api),
                completion.finish_reason or "?",
                len(completion.content),
                redactor.text(completion.content[:300]),
            )
            return Attempt(
                None,
                self.origin,
                detail="simulator output not parsable",
                fallback=protocol.simulation_failed_answer(),
            )
        if parsed.method != "json":
            log.info("simulator output for %s parsed by the %s extractor", clip(call.api), parsed.method)
        rejected = invalid(parsed.answer, self.origin, self.validity)
        if rejected is not None:
            log.warning("simulated answer for %s rejected: %s", clip(call.api), rejected.detail)
            return Attempt(None, self.origin, detail=rejected.detail, fallback=redactor.data(rejected.fallback))
        if retries:
            self._count_retry(success=True)
        # no key reaches the store, even when the endpoint echoes one (in the answer or its rationale)
        meta = self.generation_meta(completion, parsed, seed, latency, retries)
        return Attempt(redactor.data(parsed.answer), self.origin, meta=redactor.data(meta))

    def generation_meta(self, completion: Completion, parsed: Parsed, seed: int | None, latency_s: float, retries: int) -> dict[str, Any]:
        """What the generation knew, kept on the record beside the served answer (never served)."""
        meta: dict[str, Any] = {
            "style": self.style,
            "model": completion.model,
            "prompt_sha256": self.prompt.sha256,
            "temperature": self.client.temperature,
            "seed": seed,
            "finish_reason": completion.finish_reason,
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "latency_s": round(latency_s, 6),
        }
        if retries:
            meta["parse_retries"] = retries
        if parsed.mechanism:
            meta["mechanism_of_the_api"] = parsed.mechanism
        before = text_before_answer(completion.content)
        if before:
            meta["text_before_answer"] = before
        # a lone surrogate (a "\ud800" escape in the server's JSON) cannot be stored as UTF-8
        return {k: _clean(v) if isinstance(v, str) else v for k, v in meta.items()}

    # -- counters (read by /stats) ------------------------------------------------------------

    EVENTS = ("parse_retries", "parse_retry_successes")

    def use_stats(self, stats: Any) -> None:
        """Count this simulator's events in the server's counters (shared by its workers)."""
        self._events = stats

    def _count_retry(self, success: bool = False) -> None:
        self._events.count_event("simulator", "parse_retry_successes" if success else "parse_retries")

    def stats(self) -> dict[str, dict[str, int]]:
        """For ``/stats``: ``parse_retries`` (completions asked for again) and ``parse_retry_successes`` (answers a retry gave)."""
        return event_section(self._events, "simulator", self.EVENTS)

    def close(self) -> None:
        self.client.close()


def text_before_answer(content: str) -> str:
    """What a model wrote before its JSON answer (a reasoning preamble), without code-fence markers."""
    brace = content.find("{")
    if brace <= 0:
        return ""
    before = content[:brace].strip()
    if before.endswith("```json") or before.endswith("```"):
        before = before[: before.rfind("```")].rstrip()
    return before


def _clean(text: str) -> str:
    # a lone surrogate cannot be stored as UTF-8; a runaway output must not bloat the record
    return text[:MAX_RATIONALE_CHARS].encode("utf-8", "replace").decode("utf-8")


#: the ``finish_reason`` values of a completion that ended by itself: OpenAI's and vLLM's ``stop``,
#: and the names other OpenAI-compatible servers give the same end (TGI until mid-2024 and IBM
#: watsonx: ``eos_token``; TGI: ``stop_sequence``; Together.ai's Llama models: ``eos``)
COMPLETE_FINISH_REASONS = frozenset({"stop", "eos", "eos_token", "stop_sequence"})


def incomplete(finish_reason: str | None) -> str | None:
    """``None`` when a completion ended by itself, else the failure's detail (naming the cause).

    ``length`` (cut at ``max_tokens``), ``content_filter`` (content withheld), ``tool_calls`` /
    ``function_call`` (no answer text), vLLM's ``abort``, any other value, and a missing or empty
    one (OpenAI's API and vLLM's server always send it, and vLLM's engine leaves it ``None`` only
    for an unfinished sequence) are incomplete.
    """
    if finish_reason in COMPLETE_FINISH_REASONS:
        return None
    if not finish_reason:
        return "simulator output incomplete (no finish_reason)"
    return f"simulator output incomplete (finish_reason {clip(finish_reason, 40)})"


#: ``simulator.validity``: the real path's rules (:mod:`..real.validity`) applied to simulated answers
VALIDITY_RULES = ("strict", "compatible", "off")


def invalid(answer: Any, origin: str, validity: str = "strict") -> Attempt | None:
    """``None`` when a parsed simulated answer may be recorded, else the failed :class:`Attempt`.

    ``strict`` and ``compatible`` are :func:`~..real.validity.classify`'s two rule sets (the real
    API's ``strict_validity`` true / false); ``off`` records every parsed answer, as
    StableToolBench's own simulator does.  A rejected answer is served as the model wrote it
    (the agent sees the error it describes) and is not a usable answer.
    """
    if validity == "off":
        return None
    verdict = classify(answer, strict=validity == "strict")
    if verdict.valid:
        return None
    return Attempt(None, origin, detail=f"invalid simulated answer: {verdict.reason}", fallback=answer)

