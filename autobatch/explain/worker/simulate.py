"""A training step under fake tensors: its memory, with no real allocation.

:func:`simulate` builds the model and the batch under ``FakeTensorMode``, runs two full steps of the probe's
own step (the second with the optimizer state resident) and tracks every storage with a
:class:`~autobatch.explain.worker.tracker.MemoryTracker` whose allocator model gives the device's figure.
What a simulation cannot see, and an estimate therefore leaves out: docs/explain-estimate.md ("What a
simulation cannot see").
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, replace

from autobatch.core.levels import OFF
from autobatch.errors import AutobatchError, ContractError, NoBlocksError
from autobatch.explain.pure.maxima import SimResult
from autobatch.explain.pure.records import Scenario
from autobatch.explain.worker.allocators import make_allocator
from autobatch.explain.worker.breakdown import Instrument
from autobatch.explain.worker.ranks import FakeRank, track_resize
from autobatch.explain.worker.tracker import MemoryTracker
from autobatch.explain.worker.transforms import applied_during_step
from autobatch.records.protocol import StepConfig
from autobatch.step.contract import UserScript
from autobatch.step.loop import StepReport, build_step, one_step
from autobatch.step.optimizers import optimizer_state_bytes

#: Optimizers whose torch.optim class takes ``foreach`` (on CUDA it defaults to True).
FOREACH = ("sgd", "sgd-momentum", "adam", "adamw", "adafactor", "rmsprop", "adagrad")


def simulate(
    script: UserScript,
    scenario: Scenario,
    batch_size: int,
    *,
    target: str,
    step: StepConfig = StepConfig(0, "32-true", "sgd"),
    steps: int = 2,
    rank: FakeRank | None = None,
) -> SimResult:
    """Run ``steps`` full steps under fake tensors and report the peak (see the module docstring;
    ``rank``: one rank of a distributed strategy in a fake process group, :mod:`.ranks`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    result = SimResult(batch_size)
    tracker = MemoryTracker(make_allocator(target), fake_scalars=True)
    instrument = Instrument(scenario.transforms, tracker, modules=False)
    kwargs = dict(step.optimizer_kwargs)
    if target == "cuda" and scenario.optimizer in FOREACH:
        kwargs.setdefault("foreach", True)
    level = scenario.level if scenario.recompute else OFF
    config = replace(
        step,
        batch_size=batch_size,
        precision=scenario.precision,
        optimizer=scenario.optimizer,
        level=level,
        optimizer_kwargs=kwargs,
    )
    try:
        with (
            FakeTensorMode(allow_non_fake_inputs=True),
            instrument,
            applied_during_step(scenario.transforms, instrument.applied),
            track_resize(tracker) if rank is not None else contextlib.nullcontext(),
        ):
            result.static = _run(instrument.wrap(script), config, steps, rank)
    except Exception as exc:  # noqa: BLE001 - a step that cannot run under fake tensors is reported
        if isinstance(exc, ContractError) and not isinstance(exc, NoBlocksError):
            raise  # the script breaks the contract: no scenario can run
        result.ok = False
        # an autobatch error's message alone: its hint is the command's to give
        said = exc.message if isinstance(exc, AutobatchError) else exc
        result.error = f"{type(exc).__name__}: {said}".strip()[:2000]
    extra = rank.extra_bytes(result.static) if rank is not None and result.ok else 0
    result.device_peak = tracker.allocator.peak + extra
    result.tensor_peak = tracker.peak.tensor_bytes + extra
    result.categories = tracker.peak_categories()
    result.step_peaks = list(tracker.step_peaks)
    result.rising_peak = tracker.rising_peak + extra if tracker.rising_peak else None
    result.peak_phase = f"step {tracker.peak.step} {tracker.peak.phase}"
    result.notes = list(instrument.applied.notes)
    result.applied = asdict(instrument.applied)
    result.seconds = time.perf_counter() - started
    return result


def _run(script: UserScript, config: StepConfig, steps: int, rank: FakeRank | None) -> dict[str, int]:
    """Build the step with fake tensors, run it, and return its static memory."""
    report = StepReport()
    step = build_step(script, config, report, fake=True, wrap=rank.wrap if rank is not None else None)
    for _ in range(steps):
        one_step(step)
    return {
        "parameters": report.param_bytes,
        "gradients": step.grad_bytes,
        "optimizer_state": optimizer_state_bytes(step.optimizer),
    }
