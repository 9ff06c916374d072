"""A small real :class:`~stabletoolbench_mirror.engine.responders.Responder` for store and layer tests.

It answers every call with a deterministic answer derived from the call's key (so a
test can check that each stored entry belongs to its key), optionally after a delay,
and counts the calls it answered.  Tests of the simulator itself use the simulator
with ``tests.helpers.openai_stub`` instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from stabletoolbench_mirror.core.call import ToolCall
from stabletoolbench_mirror.core.records import Record
from stabletoolbench_mirror.engine.responders import Attempt


def expected_answer(api: str, key: str) -> dict[str, Any]:
    return {"error": "", "response": f"answer for {api} {key}"}


class KeyedResponder:
    source = "simulated"

    def __init__(self, delay_s: float = 0.0, origin: str = "keyed-test-responder") -> None:
        self.delay_s = delay_s
        self.origin = origin
        self.calls = 0
        self.active = 0
        self.max_active = 0
        """The most calls answered at once."""
        self._lock = threading.Lock()

    def respond(self, call: ToolCall, examples: Sequence[Record]) -> Attempt:
        with self._lock:
            self.calls += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
        finally:
            with self._lock:
                self.active -= 1
        return Attempt(expected_answer(call.api, call.key), self.origin)

    def close(self) -> None:
        pass
