"""Fake probes: exercise the search, the runner and the CLI without torch or a device.

In the spirit of httpx's ``MockTransport``: the search talks to a probe callable
(``autobatch.core.search.ProbeFn``), so a synthetic memory curve and a budget stand in for a real
device. A curve maps a batch size to the peak bytes of a training step:

* :func:`affine` ``a + k*b`` — the common case (static memory + activations per sample);
* :func:`quadratic` ``a + k*b + q*b*b`` — a loss with a batch x batch similarity matrix;
* :func:`staircase` — an affine curve rounded up to allocator segments (flat runs, then jumps);
* :func:`plateau` — flat (the optimizer step's peak: parameters, gradients, optimizer state and the
  step's temporaries) until the forward and backward pass's activations overtake it;
* :func:`noisy` — any curve whose *measured* peak carries a few % of deterministic noise while
  feasibility still follows the true curve (measurement noise, not a flickering device).

:class:`FakeProbe` answers "does batch b fit?" from a curve and a budget and records every call;
:class:`FakeStepProbe` does the same for the per-combination procedure (steps and purposes);
:class:`FakeRunner` stands in for the probe server behind a :class:`~autobatch.run.session.Session`, so
that ``tune``, ``check`` and ``explain`` run end to end (under Typer's ``CliRunner`` too) with no torch;
:func:`true_max` is the brute-force oracle the property tests compare the search against.
Pure Python: importable without torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from autobatch.core.search import Guidance, Observation, search_max_batch
from autobatch.records.protocol import ProbeOutcome, ProbeRequest

__all__ = [
    "AffineCurve",
    "Curve",
    "FakeProbe",
    "FakeRunner",
    "FakeStepProbe",
    "NoisyCurve",
    "PlateauCurve",
    "QuadraticCurve",
    "StaircaseCurve",
    "affine",
    "noisy",
    "plateau",
    "quadratic",
    "staircase",
    "true_max",
]


class Curve:
    """Peak bytes of one training step as a function of the batch size.

    ``curve(b)`` is the true peak, which decides feasibility; ``curve.measure(b)`` is what a probe
    would report (the same, unless the curve is :func:`noisy`).
    """

    def __call__(self, batch_size: int) -> int:
        raise NotImplementedError

    def measure(self, batch_size: int) -> int:
        return self(batch_size)

    def rising(self, batch_size: int) -> int:
        """The measured peak of the batch-dependent phase (forward and backward) alone."""
        return self.measure(batch_size)


@dataclass(frozen=True)
class AffineCurve(Curve):
    intercept: float
    slope: float

    def __call__(self, batch_size: int) -> int:
        return math.ceil(self.intercept + self.slope * batch_size)


@dataclass(frozen=True)
class QuadraticCurve(Curve):
    intercept: float
    slope: float
    curvature: float

    def __call__(self, batch_size: int) -> int:
        b = batch_size
        return math.ceil(self.intercept + self.slope * b + self.curvature * b * b)


@dataclass(frozen=True)
class StaircaseCurve(Curve):
    intercept: float
    slope: float
    step_bytes: int

    def __call__(self, batch_size: int) -> int:
        raw = self.intercept + self.slope * batch_size
        return math.ceil(raw / self.step_bytes) * self.step_bytes


@dataclass(frozen=True)
class PlateauCurve(Curve):
    flat: float
    intercept: float
    slope: float

    def __call__(self, batch_size: int) -> int:
        return math.ceil(max(self.flat, self.intercept + self.slope * batch_size))

    def rising(self, batch_size: int) -> int:
        return math.ceil(self.intercept + self.slope * batch_size)


@dataclass(frozen=True)
class NoisyCurve(Curve):
    curve: Curve
    rel: float
    seed: int

    def __call__(self, batch_size: int) -> int:
        return self.curve(batch_size)

    def measure(self, batch_size: int) -> int:
        return self._noisy(self.curve.measure(batch_size), batch_size)

    def rising(self, batch_size: int) -> int:
        return self._noisy(self.curve.rising(batch_size), batch_size)

    def _noisy(self, value: int, batch_size: int) -> int:
        # Deterministic per (seed, batch): re-measuring the same batch gives the same number.
        rng = random.Random(self.seed * 1_000_003 + batch_size)
        return max(0, round(value * (1 + rng.uniform(-self.rel, self.rel))))


def affine(intercept: float, slope: float) -> AffineCurve:
    """``peak(b) = intercept + slope*b`` bytes."""
    return AffineCurve(intercept, slope)


def quadratic(a: float, k: float, q: float) -> QuadraticCurve:
    """``peak(b) = a + k*b + q*b*b`` bytes (a batch x batch term, as in contrastive losses)."""
    return QuadraticCurve(a, k, q)


def staircase(a: float, k: float, step_bytes: int) -> StaircaseCurve:
    """``a + k*b`` rounded up to a multiple of ``step_bytes`` (allocator segments)."""
    if step_bytes < 1:
        raise ValueError(f"step_bytes must be >= 1, got {step_bytes}")
    return StaircaseCurve(a, k, step_bytes)


def plateau(flat: float, intercept: float, slope: float) -> PlateauCurve:
    """``max(flat, intercept + slope*b)``: the optimizer step sets the peak until activations overtake it."""
    return PlateauCurve(flat, intercept, slope)


def noisy(curve: Curve, rel: float = 0.02, seed: int = 0) -> NoisyCurve:
    """``curve`` whose measured peaks are off by up to ``rel`` (uniform); feasibility is unchanged."""
    if not 0 <= rel < 1:
        raise ValueError(f"rel must be in [0, 1), got {rel}")
    return NoisyCurve(curve, rel, seed)


@dataclass
class FakeProbe:
    """A :data:`~autobatch.core.search.ProbeFn` over a synthetic curve: fits iff ``curve(b) <= budget``.

    ``calls`` records every batch size asked for, in order. ``fail_kind`` is the kind reported when
    a batch does not fit ("oom" by default; "crash"/"timeout" to exercise those paths).
    ``report_peaks=False`` hides the peak (a device that cannot measure it).
    ``throughput`` optionally maps a batch size to samples per second, reported for fitting probes.
    ``static_bytes``: what a fit reports it measured of memory that does not scale with the batch.
    """

    curve: Curve | Callable[[int], float]
    budget_bytes: int
    fail_kind: str = "oom"
    throughput: Callable[[int], float] | None = None
    report_peaks: bool = True
    static_bytes: int | None = None  # what a fit reports of memory that does not scale (None: nothing)
    calls: list[int] = field(default_factory=list)

    def __call__(self, batch_size: int) -> Observation:
        self.calls.append(batch_size)
        peak = self.curve(batch_size)
        if peak > self.budget_bytes:
            return Observation(batch_size, fits=False, kind=self.fail_kind)
        measured = self.curve.measure(batch_size) if isinstance(self.curve, Curve) else peak
        sps = self.throughput(batch_size) if self.throughput is not None else None
        reported = int(measured) if self.report_peaks else None
        return Observation(
            batch_size, fits=True, peak_bytes=reported, samples_per_second=sps, static_bytes=self.static_bytes
        )


@dataclass
class ProcessNoise:
    """How much a probe's memory moves with the process it runs in: the tune's baseline, up to ``tune_bytes``
    either way (drawn once), each probe's process up to ``process_bytes`` more either way, in its peaks and its
    static memory alike, and a probe as long as a confirmation (``long_steps`` steps or more) ``long_bytes``
    higher. Seeded: the same draws every run."""

    tune_bytes: int = 0
    process_bytes: int = 0
    long_bytes: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._tune = self._rng.uniform(-self.tune_bytes, self.tune_bytes)

    @property
    def tune_offset(self) -> int:
        """The tune's own baseline shift, which every probe of the tune shares."""
        return math.ceil(self._tune)

    def draw(self, long: bool) -> int:
        """The offset of one probe's process (a confirmation-length probe's included)."""
        process = self._rng.uniform(-self.process_bytes, self.process_bytes)
        return math.ceil(self._tune + process + (self.long_bytes if long else 0))


@dataclass
class FakeStepProbe:
    """A :data:`~autobatch.core.maximum.ProbeCall` over a synthetic curve, for the per-combination search.

    A probe of ``(min_steps, max_steps)`` runs ``min_steps`` steps (its peak holds still from there) and fits
    iff ``curve(b) <= budget``, unless ``fails_long(batch, purpose)`` says that a probe allowed at least
    ``long_steps`` steps fails there (a boundary that flickers, memory that creeps over steps, so that a real
    probe keeps stepping until it crosses; a confirmation that never holds).
    ``phases``: report the rising phase's peak apart (``Observation.rising_bytes``, from
    :meth:`Curve.rising`), as a real probe does; a probe that does not fit reports it too when its first
    step's forward and backward (the rising phase less ``state_bytes`` of optimizer state) fitted.
    ``static_bytes``: what a fit reports it measured of memory that does not scale with the batch
    (:attr:`Observation.static_bytes`; None: nothing, as before probes measured it). ``cap_bytes``: the
    device's hard limit above ``budget_bytes`` (the search's line): a batch whose peak lies between them
    stops at the step that crosses the line, with that peak, as a real probe does; one past the cap fails
    its first allocation, with no peak and no step (None: every miss as one that crossed, peak or not
    as ``phases`` says). ``noise``: how each probe's process moves its memory (:class:`ProcessNoise`;
    None: not at all). ``calls`` records ``(batch, steps, purpose)`` in order.
    """

    curve: Curve
    budget_bytes: int
    long_steps: int = 10
    fails_long: Callable[[int, str], bool] | None = None
    phases: bool = False
    state_bytes: int = 0
    static_bytes: int | None = None
    cap_bytes: int | None = None
    noise: ProcessNoise | None = None
    calls: list[tuple[int, tuple[int, int], str]] = field(default_factory=list)

    def __call__(self, batch_size: int, steps: tuple[int, int], purpose: str) -> Observation:
        self.calls.append((batch_size, steps, purpose))
        ran = steps[0]
        too_long = (
            steps[1] >= self.long_steps
            and self.fails_long is not None
            and self.fails_long(batch_size, purpose)
        )
        shift = self.noise.draw(steps[1] >= self.long_steps) if self.noise is not None else 0
        total, peak = self.curve(batch_size) + shift, self.curve.measure(batch_size) + shift
        rising = self.curve.rising(batch_size) + shift if self.phases else None
        if self.cap_bytes is not None and total > self.cap_bytes:
            # An allocation failed. When the first forward and backward fitted (the optimizer state came
            # after), the probe read the rising phase and stopped in its first step, as a real one does.
            if rising is not None and rising - self.state_bytes <= self.cap_bytes:
                return Observation(batch_size, fits=False, kind="oom", steps=1, rising_bytes=rising)
            return Observation(batch_size, fits=False, kind="oom", steps=0)
        if self.cap_bytes is not None and total > self.budget_bytes:
            return Observation(
                batch_size, fits=False, kind="oom", peak_bytes=peak, steps=1, rising_bytes=rising
            )
        if total > self.budget_bytes or too_long:
            first = rising is not None and rising - self.state_bytes <= self.budget_bytes
            # As a real probe stops at the step whose peak crosses its line: the peak it reached.
            return Observation(
                batch_size,
                fits=False,
                kind="oom",
                peak_bytes=peak if first else None,
                steps=ran,
                rising_bytes=rising if first else None,
            )
        static = self.static_bytes + shift if self.static_bytes is not None else None
        return Observation(
            batch_size, fits=True, peak_bytes=peak, steps=ran, rising_bytes=rising, static_bytes=static
        )


def true_max(
    curve: Curve | Callable[[int], float], budget: int, max_batch_size: int, multiple: int = 1
) -> int | None:
    """Brute force: the largest multiple of ``multiple`` (<= ``max_batch_size``) such that it and
    every smaller candidate fit; None when the smallest candidate does not fit."""
    best: int | None = None
    for b in range(multiple, max_batch_size + 1, multiple):
        if curve(b) > budget:
            break
        best = b
    return best


class _Asked(Exception):
    """Ends a replayed search at its next probe."""


def next_probe(known: list[Observation], budget_bytes: int, floor_bytes: int) -> tuple[int, bool]:
    """The search's next probe after the observations ``known`` (a real tune's, replayed), and whether it runs as
    long as a confirmation: what a change to the search does at one step of a tune, without running the rest."""
    asked: list[tuple[int, bool]] = []

    def ask(final: bool) -> Callable[[int], Observation]:
        def probe(batch: int) -> Observation:
            asked.append((batch, final))
            raise _Asked

        return probe

    try:
        search_max_batch(
            ask(False),
            budget_bytes=budget_bytes,
            max_batch_size=65536,
            known=known,
            guidance=Guidance(start=8, floor_bytes=floor_bytes, final_probe=ask(True), long_steps=6),
        )
    except _Asked:
        return asked[0]
    raise AssertionError("the search ended without another probe")


@dataclass
class FakeRunner:
    """A :class:`~autobatch.records.protocol.ProbeRunner` that answers from synthetic memory curves.

    ``curve`` gives the peak of a probe of the real step: one curve for every combination, or a function
    of ``(precision, optimizer, recompute)``; ``lengths``, when given, the curve of a request at a sequence
    length (``seq_len``) instead; ``levels``, the curve of a recomputation level and compile
    (``recompute_counts``: the blocks the inspection reports; ``compile_error``: a compiled probe fails so). A probe fits iff its peak is within the request's budget;
    ``steps_seconds`` is each step's time (throughput = batch / seconds). It answers the ``inspect``
    operation as a CPU device with ``available_bytes`` and ``baseline_bytes``, the ``explain`` operation
    with a breakdown that adds up to the peak, and the ``estimate`` operation from the same curves.
    ``requests`` records every request; ``closed`` whether :meth:`close` ran.
    """

    curve: Curve | Callable[[str, str, bool], Curve]
    lengths: Callable[[int], Curve] | None = None
    levels: Callable[[str, bool], Curve] | None = None
    recompute_counts: dict[str, int] = field(default_factory=dict)
    compile_error: str | None = None  # what a compiled probe fails with (None: it compiles)
    level_seconds: Callable[[str], float] | None = None  # a level's step time (None: step_seconds)
    available_bytes: int = 16 << 30
    baseline_bytes: int = 300 << 20
    param_shapes: tuple[tuple[int, ...], ...] = ((1024, 1024), (1024,))
    recompute_blocks: tuple[str, ...] = ("Block",)
    unsupported_precisions: dict[str, str] = field(default_factory=dict)
    step_seconds: float = 0.01
    torch_version: str = "fake"
    requests: list[ProbeRequest] = field(default_factory=list)
    closed: bool = False

    def curve_for(self, precision: str, optimizer: str, recompute: bool) -> Curve:
        curve = self.curve
        return curve if isinstance(curve, Curve) else curve(precision, optimizer, recompute)

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        self.requests.append(request)
        if request.op == "inspect":
            return ProbeOutcome(kind="fits", info=self._inspection())
        if request.op == "estimate":
            return ProbeOutcome(kind="fits", info={"scenarios": self._estimates(request)})
        outcome = self._probe(request)
        if request.op == "explain" and outcome.fits and outcome.peak_bytes:
            outcome.info = self._breakdown(outcome.peak_bytes)
        return outcome

    def close(self) -> None:
        self.closed = True

    def _inspection(self) -> dict[str, object]:
        return {
            "cuda_available": False,
            "available_bytes": self.available_bytes,
            "baseline_bytes": self.baseline_bytes,
            "param_shapes": [list(s) for s in self.param_shapes],
            "param_count": sum(math.prod(s) for s in self.param_shapes),
            "recompute_blocks": list(self.recompute_blocks),
            "recompute_counts": dict(self.recompute_counts),
            "unsupported_precisions": dict(self.unsupported_precisions),
        }

    def _probe(self, request: ProbeRequest) -> ProbeOutcome:
        step = request.step
        curve = self.curve_for(step.precision, step.optimizer, step.recompute)
        if self.lengths is not None and step.seq_len is not None:
            curve = self.lengths(step.seq_len)
        if self.levels is not None:
            curve = self.levels(step.level, step.compile)
        if step.compile and self.compile_error is not None:
            return ProbeOutcome(
                kind="error",
                error_type="CompileError",
                error_message=self.compile_error,
                info={"compile_error": True},
            )
        batch, steps = request.batch_size, request.min_steps
        if curve(batch) > request.budget_bytes:
            return ProbeOutcome(kind="oom", batch_size=batch, steps=1, reason="fake: over the budget")
        peak = int(curve.measure(batch))
        seconds = self.step_seconds
        if self.level_seconds is not None:
            seconds = self.level_seconds(step.level)
        params = 4 * sum(math.prod(s) for s in self.param_shapes)
        return ProbeOutcome(
            kind="fits",
            batch_size=batch,
            peak_bytes=peak,
            step_peaks=[peak] * steps,
            baseline_bytes=self.baseline_bytes,
            budget_bytes=request.budget_bytes,
            steps=steps,
            step_seconds=[seconds] * steps,
            samples_per_second=batch / seconds,
            param_bytes=params,
            grad_bytes=params,
            optimizer_state_bytes=2 * params if step.optimizer.startswith("adam") else 0,
        )

    def _breakdown(self, peak: int) -> dict[str, object]:
        params = 4 * sum(math.prod(s) for s in self.param_shapes)
        fixed = {"baseline": min(self.baseline_bytes, peak), "parameters": params, "gradients": params}
        rest = peak - sum(fixed.values())
        return {
            "categories": {**fixed, "activations": max(rest, 0)},
            "residual_bytes": min(rest, 0),
            "modules": [],
            "peak_phase": "step 2 backward",
            "notes": ["fake breakdown"],
        }

    def _estimates(self, request: ProbeRequest) -> list[dict[str, object]]:
        options = request.options
        budget, top = int(options["budget_bytes"]), int(options["max_batch_size"])
        out: list[dict[str, object]] = []
        for scenario in options.get("scenarios", []):
            curve = self.curve_for(scenario["precision"], scenario["optimizer"], bool(scenario["recompute"]))
            best = true_max(curve, budget, top, int(options.get("batch_multiple", 1)))
            points = {str(b): curve(int(b)) for b in options.get("report_at", [])}
            out.append(
                {
                    "name": scenario.get("name", ""),
                    "status": "exact" if best is not None else "infeasible",
                    "max_batch_size": best,
                    "points": points,
                    "intercept_bytes": float(curve(0)),
                    "bytes_per_sample": float(curve(2) - curve(1)),
                }
            )
        return out
