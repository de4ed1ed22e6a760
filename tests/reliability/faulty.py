"""A fake probe runner that crashes or hangs where a test says (no torch, no server)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.testing import FakeRunner


@dataclass
class FaultyRunner(FakeRunner):
    """``fault(request, attempt)`` returns "crash", "timeout" or None (answer from the curve);
    ``attempt`` counts the runs of the same (combination, batch, steps) so far, from 1."""

    fault: Callable[[ProbeRequest, int], str | None] = lambda request, attempt: None
    attempts: dict[tuple[object, ...], int] = field(default_factory=dict)

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        if request.op != "probe":
            return super().run(request)
        step = request.step
        key = (step.precision, step.optimizer, step.recompute, step.batch_size, request.min_steps)
        self.attempts[key] = self.attempts.get(key, 0) + 1
        kind = self.fault(request, self.attempts[key])
        if kind is None:
            return super().run(request)
        self.requests.append(request)
        reason = (
            "the probe process killed by signal 11 (SIGSEGV) without reporting"
            if kind == "crash"
            else "no answer"
        )
        return ProbeOutcome(kind=kind, batch_size=request.batch_size, reason=reason)
