"""A probe runner that runs the real contract checks in this process (no server, no fork, no cap).

It loads the script with :func:`autobatch.step.contract.load_script` (what the probe server does at start),
answers ``inspect`` with the real operation, and runs a ``probe`` as one real step through
:func:`autobatch.step.loop.run_steps`, translating any exception with the real
:func:`autobatch.records.failures.describe_failure`. Memory is not measured: a probe that ran fits or
not by a synthetic curve. So the catalogue checks every contract message in milliseconds; the probe
server's own isolation is exercised by the slow tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

from autobatch.probe.ops import dispatch, load_operations
from autobatch.records.failures import describe_failure
from autobatch.records.protocol import ProbeOutcome, ProbeRequest
from autobatch.step.contract import load_script
from autobatch.testing import affine

MiB = 1 << 20
CURVE = affine(300 * MiB, 2 * MiB)
BASELINE = 200 * MiB  # what inspect reports of a probe process before the model (a synthetic figure)


class InProcessRunner:
    def __init__(self, script: str | Path, args: list[str] | tuple[str, ...] = ()) -> None:
        import torch

        argv, path = list(sys.argv), list(sys.path)
        try:
            self.script = load_script(script, args)
        finally:
            sys.argv[:], sys.path[:] = argv, path
        load_operations([])
        self.torch_version = torch.__version__
        self.requests: list[ProbeRequest] = []

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        self.requests.append(request)
        if request.op != "probe":
            outcome = dispatch(request, self.script)
            if (
                "baseline_bytes" in outcome.info
            ):  # memory is not measured: this process holds what the tests imported
                outcome.info["baseline_bytes"] = BASELINE
            return outcome
        from autobatch.core.step_peaks import StepRule
        from autobatch.step.loop import StepReport, run_steps

        outcome = ProbeOutcome(kind="fits", batch_size=request.batch_size, budget_bytes=request.budget_bytes)
        peak = CURVE(request.batch_size)
        try:
            run_steps(self.script, request.step, StepReport(), StepRule(1, 1, MiB), peak_now=lambda: peak,
                      synchronize=lambda: None)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - as the probe process does
            return describe_failure(outcome, exc)
        if peak > request.budget_bytes:
            return ProbeOutcome(kind="oom", batch_size=request.batch_size, steps=1, reason="over the curve")
        outcome.peak_bytes, outcome.steps = peak, request.min_steps
        outcome.step_peaks, outcome.step_seconds = [peak] * outcome.steps, [0.01] * outcome.steps
        outcome.samples_per_second = request.batch_size / 0.01
        return outcome

    def close(self) -> None:
        pass
