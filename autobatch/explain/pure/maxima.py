"""The largest batch a step would fit, predicted from fake-tensor simulations (no real allocation).

For one :class:`~autobatch.explain.pure.records.Scenario`, ``predicted(b) = offset(b) + simulated(b)``: the
simulated step's peak plus an affine offset for what the simulation cannot see (a probe's baseline and
:data:`CPU_RUNTIME_BYTES` on the CPU, a card's workspaces, or calibration on a measured run). The maximum is
found with ``tune``'s own search over the simulated curve. Details: docs/explain-estimate.md ("What a
simulation cannot see").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autobatch.core.search import Observation, SearchResult, search_max_batch
from autobatch.explain.pure.records import Scenario

if TYPE_CHECKING:
    from autobatch.records.result import ComboResult

MiB = 1 << 20
#: Assumed CPU runtime buffers outside PyTorch's allocator (MKL GEMM buffers, oneDNN scratchpads)
#: (docs/measurements/in-the-code.md).
CPU_RUNTIME_BYTES = 32 * MiB


class SimulationError(Exception):
    """A step that could not be simulated (the search stops; the estimate operation reports it)."""


@dataclass(frozen=True)
class Offset:
    """``intercept + slope * b``: the memory a simulation does not see (bytes)."""

    intercept: float
    slope: float = 0.0
    basis: str = ""

    def at(self, batch_size: int) -> float:
        return self.intercept + self.slope * batch_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Offset:
        return cls(float(data["intercept"]), float(data.get("slope", 0.0)), str(data.get("basis", "")))


def calibrated_offset(points: list[tuple[int, int]], simulated: dict[int, int]) -> Offset:
    """The offset through measured peaks: ``measured(b) - simulated(b)`` at the largest measured batch.

    Held constant in the batch size: what a simulation misses is mostly caches that grow to a ceiling
    (MKL's GEMM buffers reach theirs within a few dozen samples), so extrapolating the difference
    between two small batch sizes as a slope would charge every further sample for a cache that no
    longer grows.
    """
    b, measured = max(points)
    return Offset(measured - simulated[b], 0.0, f"measured - simulated at batch {b}")


@dataclass
class SimResult:
    """One simulated batch size (bytes; ``device_peak`` in the target device's units), as
    :func:`autobatch.explain.worker.simulate.simulate` reports it."""

    batch_size: int
    ok: bool = True
    error: str | None = None
    device_peak: int = 0
    tensor_peak: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    step_peaks: list[int] = field(default_factory=list)
    #: The device's peak in forward and backward with the optimizer state resident (None: not seen).
    rising_peak: int | None = None
    static: dict[str, int] = field(default_factory=dict)  # parameters, gradients, optimizer_state
    peak_phase: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)  # what the transforms changed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScenarioEstimate:
    """A scenario's predicted maximum (``status``: exact | capped | infeasible | error)."""

    name: str
    scenario: dict[str, Any]
    status: str = "exact"
    max_batch_size: int | None = None
    peak_bytes: int | None = None  # predicted at the maximum, offset included
    categories: dict[str, int] = field(default_factory=dict)  # simulated tensors at the maximum
    static_bytes: dict[str, int] = field(default_factory=dict)  # parameters, gradients, optimizer_state
    bytes_per_sample: float | None = None
    intercept_bytes: float | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)
    points: dict[str, int] = field(default_factory=dict)  # predicted(b) at requested batch sizes
    error: str | None = None
    seconds: float = 0.0
    applied: dict[str, Any] = field(default_factory=dict)  # what the scenario's transforms changed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Simulator = Callable[[Scenario, int], SimResult]


def estimate_scenario(
    name: str,
    scenario: Scenario,
    simulate: Simulator,
    *,
    offset: Offset,
    budget_bytes: int,
    max_batch_size: int,
    batch_multiple: int = 1,
    report_at: tuple[int, ...] = (),
) -> ScenarioEstimate:
    """Search the scenario's maximum over simulations; see the module docstring."""
    out = ScenarioEstimate(name, scenario.to_dict())
    runs: dict[int, SimResult] = {}

    def predicted(b: int) -> int:
        if b not in runs:
            result = simulate(scenario, b)
            runs[b] = result
            out.seconds += result.seconds
            out.applied = out.applied or dict(result.applied)
            if not result.ok:
                raise SimulationError(result.error or "the simulated step failed")
        return int(offset.at(b) + runs[b].device_peak)

    def probe(b: int) -> Observation:
        total = predicted(b)
        fits = total <= budget_bytes
        out.trace.append(
            {"batch_size": b, "fits": fits, "predicted_bytes": total, "seconds": runs[b].seconds}
        )
        # The batch-dependent phase's peak: where the optimizer step's flat peak sets the total (small
        # batches of a parameter-heavy model), the search still sees the per-sample cost.
        rising = runs[b].rising_peak
        rising_bytes = int(offset.at(b) + rising) if rising is not None else None
        kind = "fits" if fits else "oom"
        return Observation(b, fits, peak_bytes=total if fits else None, kind=kind, rising_bytes=rising_bytes)

    try:
        for b in report_at:
            out.points[str(b)] = predicted(b)
        seeds = _seed(probe, budget_bytes, max_batch_size, batch_multiple)
        result = search_max_batch(
            probe,
            budget_bytes=budget_bytes,
            max_batch_size=max_batch_size,
            batch_multiple=batch_multiple,
            known=seeds,
        )
    except SimulationError as exc:
        out.status, out.error = "error", str(exc)
        return out
    _record(out, result, runs, offset, budget_bytes, batch_multiple)
    return out


def _record(
    out: ScenarioEstimate,
    result: SearchResult,
    runs: dict[int, SimResult],
    offset: Offset,
    budget_bytes: int,
    batch_multiple: int,
) -> None:
    """The search's answer into ``out``: status, maximum, the simulation at it, the line."""
    out.status = result.status if result.status in ("exact", "capped", "infeasible") else "exact"
    out.max_batch_size = result.max_batch_size
    if result.model is not None:
        out.bytes_per_sample, out.intercept_bytes = result.model.slope, result.model.intercept
    at = result.max_batch_size or batch_multiple
    if at in runs:
        out.peak_bytes = int(offset.at(at) + runs[at].device_peak)
        out.categories = dict(runs[at].categories)
        out.static_bytes = dict(runs[at].static)
    line = _line(runs, offset, budget_bytes)
    if line is not None:
        out.intercept_bytes, out.bytes_per_sample = line


#: The second seed simulation, in batch multiples: far enough from the first for a per-sample slope.
SEED_SPAN = 64
#: Secant steps of the seeding at most, and candidates it walks from where they converge.
SEED_STEPS = 4
SEED_WALK = 3


def _seed(probe: Callable[[int], Observation], budget: int, largest: int, m: int) -> list[Observation]:
    """Simulations that bracket the maximum in a few steps (a simulation is deterministic, so no noise
    margin is needed): the smallest candidate, one :data:`SEED_SPAN` multiples above it (times
    :data:`SEED_SPAN` again while the rising peak stays flat), then secant
    steps on the rising-phase peaks (forward and backward, flat at small batches while buffers of fixed
    size set it, affine after) to the batch where they cross the budget, and up to :data:`SEED_WALK`
    neighbours until one lands on the other side of the budget. Without
    rising peaks, only the first. The search (:func:`~autobatch.core.search.search_max_batch`) takes
    them as known and finishes from there, so the answer stays exact whatever the curve; only the
    number of simulations changes."""
    seen: dict[int, Observation] = {}

    def sim(b: int) -> Observation:
        if b not in seen:
            seen[b] = probe(b)
        return seen[b]

    first = sim(m)
    points = [(m, first.rising_bytes)]
    b = min(SEED_SPAN * m, largest // m * m)
    for _ in range(SEED_STEPS + 1):
        if b in seen or points[-1][1] is None:
            break
        points.append((b, sim(b).rising_bytes))
        (b1, r1), (b2, r2) = points[-2:]
        if r1 is None or r2 is None:
            break
        slope = (r2 - r1) / (b2 - b1)
        if slope <= 0:  # still flat: look further
            b = min(largest // m * m, max(b1, b2) * SEED_SPAN)
            continue
        b = max(m, min(largest // m * m, int((b2 + (budget - r2) / slope) // m) * m))
    if b in seen:  # converged: walk a few candidates towards the other side of the budget
        step = m if seen[b].fits else -m
        for neighbour in range(b + step, b + (SEED_WALK + 1) * step, step):
            if not m <= neighbour <= largest or sim(neighbour).fits != seen[b].fits:
                break
    return [seen[k] for k in sorted(seen)]


def _line(runs: dict[int, SimResult], offset: Offset, budget_bytes: int) -> tuple[float, float] | None:
    """Intercept and slope through the smallest simulated batch size and the largest that fits (offset
    included): far apart, so that allocator steps (2 MiB segments) do not dominate the slope."""
    sizes = sorted(b for b, r in runs.items() if r.ok)
    fitting = [b for b in sizes if offset.at(b) + runs[b].device_peak <= budget_bytes]
    if len(sizes) < 2:
        return None
    b1 = sizes[0]
    b2 = fitting[-1] if len(fitting) >= 2 else sizes[-1]
    y1 = offset.at(b1) + runs[b1].device_peak
    y2 = offset.at(b2) + runs[b2].device_peak
    slope = (y2 - y1) / (b2 - b1)
    return y2 - slope * b2, slope


def to_combo_result(found: dict[str, Any]) -> ComboResult:
    """An estimated scenario in ``tune --json``'s combination schema (``trace``: the simulations)."""
    from autobatch.records.result import ComboResult, ProbeRecord

    scenario = found["scenario"]
    recompute = bool(scenario["recompute"])
    entry = ComboResult(str(scenario["precision"]), str(scenario["optimizer"]), recompute)
    entry.recompute_level = str(scenario.get("level") or "full") if recompute else "off"
    entry.probes = len(found.get("trace", []))
    entry.trace = [
        ProbeRecord(
            batch_size=int(t["batch_size"]),
            kind="fits" if t["fits"] else "oom",
            peak_bytes=int(t["predicted_bytes"]),
            steps=2,
            seconds=round(float(t.get("seconds", 0.0)), 3),
        )
        for t in found.get("trace", [])
    ]
    if found.get("status") == "error":
        entry.status = "skipped"
        entry.reason = f"cannot be simulated: {found.get('error')}"
        return entry
    entry.status = str(found.get("status", "exact"))
    entry.max_batch_size = found.get("max_batch_size")
    entry.peak_bytes = found.get("peak_bytes")
    entry.static_bytes = {k: int(v) for k, v in (found.get("static_bytes") or {}).items()}
    entry.bytes_per_sample = found.get("bytes_per_sample")
    if entry.max_batch_size is None:
        entry.reason = "batch 1 does not fit (predicted): " + ", ".join(
            f"{k} {v / (1 << 20):.1f} MiB" for k, v in entry.static_bytes.items()
        )
    return entry
