"""The simulator as a miss responder: tool doc + prompt -> chat completion -> parsed answer."""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

from .. import protocol
from ..call import ToolCall
from ..real.validity import classify
from ..records import Record, Source
from ..responders import Attempt
from ..tooldocs import ToolDocs
from . import prompts
from .client import ChatClient, ChatError
from .parsing import parse_output

log = logging.getLogger(__name__)


class Simulator:
    """Answers a cache miss with a simulated response (recorded with ``source: simulated``).

    * a parsed answer that passes the validity rules (``validity``) -> ``Attempt(answer,
      origin=<model>)``, recorded by the layer;
    * unparsable output -> no answer, fallback ``Failed to generate fake response``;
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
        system_prompt: str | None = None,
        docs: ToolDocs | None = None,
        max_examples: int = 5,
        examples_budget_chars: int = 2048,
        structured_output: bool = False,
        structured_max_chars: int | None = None,
        max_concurrency: int = 64,
        validity: str = "strict",
    ) -> None:
        if style not in prompts.STYLES:
            raise ValueError(f"unknown simulator style {style!r}")
        self.client = client
        self.style = style
        self.system_prompt = prompts.DEFAULT_SYSTEM_PROMPTS[style] if system_prompt is None else system_prompt
        self.docs = docs
        self.max_examples = max_examples
        self.examples_budget_chars = examples_budget_chars
        self.extra: dict[str, Any] = (
            prompts.structured_output_fields(style == "mirrorapi-cot", structured_max_chars) if structured_output else {}
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        if validity not in VALIDITY_RULES:
            raise ValueError(f"unknown simulator validity rules {validity!r}")
        self.validity = validity

    @property
    def origin(self) -> str:
        """What the records name as their origin: the model (never the endpoint's key)."""
        return self.client.model

    @property
    def wants_examples(self) -> bool:
        return self.style == "gpt-fewshot" and self.max_examples > 0

    def messages(self, call: ToolCall, examples: Sequence[Record] = ()) -> list[dict[str, str]]:
        """The chat messages this simulator sends for ``call``."""
        doc = self.docs.find(call.names) if self.docs is not None else None
        if self.style == "gpt-fewshot":
            return prompts.gpt_fewshot_messages(
                self.system_prompt,
                call,
                doc,
                examples,
                max_examples=self.max_examples,
                budget_chars=self.examples_budget_chars,
            )
        return prompts.mirrorapi_messages(self.system_prompt, call, doc)

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        messages = self.messages(call, examples)
        with self._slots:
            try:
                completion = self.client.complete(messages, self.extra)
            except ChatError as exc:
                log.warning("simulator gave no answer for %s: %s", call.namespace, exc.detail)
                return Attempt(None, self.origin, detail=f"simulator unavailable: {exc.detail}")
        attempt = judge_output(completion.content, self.origin, self.validity)
        if attempt.answer is None:
            log.warning(
                "simulator output for %s: %s (finish_reason %s, %d chars): %r",
                call.namespace,
                attempt.detail,
                completion.finish_reason or "?",
                len(completion.content),
                completion.content[:300],
            )
        return attempt

    def close(self) -> None:
        self.client.close()


#: ``simulator.validity``: the real path's rules (:mod:`..real.validity`) applied to simulated answers
VALIDITY_RULES = ("strict", "compatible", "off")


def judge_output(text: str, origin: str, validity: str = "strict") -> Attempt:
    """A simulator's raw output as an :class:`Attempt`: parsed, then checked by the validity rules.

    ``strict`` and ``compatible`` are :func:`~..real.validity.classify`'s two rule sets (the
    real API's ``strict_validity`` true / false); ``off`` records every parsed answer, as
    StableToolBench's own simulator does.  An answer the rules reject is served as it is
    (the agent sees the error the model wrote) and is not a usable answer.
    """
    parsed = parse_output(text)
    if parsed.answer is None:
        return Attempt(None, origin, detail="simulator output not parsable", fallback=protocol.simulation_failed_answer())
    if validity != "off":
        verdict = classify(parsed.answer, strict=validity == "strict")
        if not verdict.valid:
            return Attempt(None, origin, detail=f"invalid simulated answer: {verdict.reason}", fallback=parsed.answer)
    if parsed.method != "json":
        log.info("simulator output parsed by the %s extractor", parsed.method)
    return Attempt(parsed.answer, origin)
