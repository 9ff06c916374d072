"""The simulator as a miss responder: tool doc + prompt -> chat completion -> parsed answer."""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

from .. import protocol
from ..call import ToolCall
from ..records import Record, Source
from ..responders import Attempt
from ..secrets import Redactor
from ..tooldocs import ToolDocs
from . import history, prompts
from .client import ChatClient, ChatError
from .parsing import parse_output

log = logging.getLogger(__name__)

STYLES = (*prompts.STYLES, "world-model")
DEFAULT_SYSTEM_PROMPTS = {**prompts.DEFAULT_SYSTEM_PROMPTS, "world-model": history.WORLD_MODEL_SYSTEM_PROMPT}


class Simulator:
    """Answers a cache miss with a simulated response (recorded with ``source: simulated``).

    * a parsed answer -> ``Attempt(answer, origin=<model>)``, recorded by the layer;
    * unparsable output -> no answer, fallback ``Failed to generate fake response`` (served,
      not recorded, so a later call may try again);
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
        redactor: Redactor | None = None,
        origin_suffix: str = "",
    ) -> None:
        if style not in STYLES:
            raise ValueError(f"unknown simulator style {style!r}")
        self.client = client
        self.style = style
        self.system_prompt = DEFAULT_SYSTEM_PROMPTS[style] if system_prompt is None else system_prompt
        self.docs = docs
        self.max_examples = max_examples
        self.examples_budget_chars = examples_budget_chars
        self.extra: dict[str, Any] = (
            prompts.structured_output_fields(style == "mirrorapi-cot", structured_max_chars) if structured_output else {}
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self.redactor = redactor or Redactor()
        """Configured keys: an endpoint may echo its key (its ``Authorization`` header) into an answer."""
        self.origin_suffix = origin_suffix
        """Marks the records' origin, e.g. `` [no tool docs]`` when simulating without any doc."""

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
                call,
                prompts.gpt_fewshot_messages(
                    self.system_prompt,
                    call,
                    doc,
                    examples,
                    max_examples=self.max_examples,
                    budget_chars=self.examples_budget_chars,
                ),
            )
        return prompts.mirrorapi_messages(self.system_prompt, call, doc)

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        messages = self.messages(call, examples)
        redactor = self.redactor.plus(call.toolbench_key)
        with self._slots:
            try:
                completion = self.client.complete(messages, self.extra)
            except ChatError as exc:
                log.warning("simulator gave no answer for %s: %s", call.namespace, exc.detail)
                return Attempt(None, self.origin, detail=f"simulator unavailable: {exc.detail}")
        parsed = parse_output(completion.content)
        if parsed.answer is None:
            log.warning(
                "simulator output for %s cannot be parsed (finish_reason %s, %d chars): %r",
                call.namespace,
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
            log.info("simulator output for %s parsed by the %s extractor", call.namespace, parsed.method)
        # no key reaches the store, even when the endpoint echoes one
        return Attempt(redactor.data(parsed.answer), self.origin)

    def close(self) -> None:
        self.client.close()
