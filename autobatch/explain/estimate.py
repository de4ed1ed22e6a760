"""The largest batch a step would fit, predicted from fake-tensor simulations (no real allocation).

For one :class:`~autobatch.explain.simulate.Scenario`, the predicted memory of batch ``b`` is::

    predicted(b) = offset(b) + simulated(b)

``simulated(b)`` is the simulated step's peak in the target device's units (CPU data memory under
autobatch's pinned glibc, or CUDA reserved segments). ``offset(b) = intercept + slope * b`` is what the
simulation cannot see:

* ``estimate --device cpu``: the probe process's baseline ``VmData`` (read in a process forked exactly
  as a probe is, after a warm-up step that loads torch's lazily imported modules) plus
  :data:`CPU_RUNTIME_BYTES` for the buffers MKL and oneDNN keep outside PyTorch's allocator;
* ``estimate`` for a CUDA card: the card profile's workspaces (the CUDA context is subtracted from the
  budget instead, as on a real GPU);
* the levers of ``explain``: calibrated on the measured run, ``offset(b) = measured(b) - simulated(b)``
  through the two measured batch sizes, so that a lever's prediction is the measured step plus what
  the simulation says the lever changes.

The maximum is found with the same pure search as ``tune`` (:func:`autobatch.core.search.search_max_batch`),
each "probe" a simulation: exact with respect to the simulated curve, whatever its shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..core.search import Affine, Observation, search_max_batch
from .simulate import Scenario, SimResult

MiB = 1 << 20
#: Assumed CPU runtime buffers outside PyTorch's allocator (MKL GEMM buffers, oneDNN scratchpads):
#: measured here at 5-40 MiB on the examples, depending on the kernels a model runs.
CPU_RUNTIME_BYTES = 32 * MiB


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
    """The offset through measured peaks: ``measured(b) - simulated(b)``, a line through two batch sizes.

    A negative slope (noise, or a simulation that over-counts per sample) is clamped to zero, so that
    extrapolating to large batches never subtracts memory.
    """
    gaps = sorted((b, measured - simulated[b]) for b, measured in points)
    if len(gaps) == 1 or gaps[0][0] == gaps[-1][0]:
        return Offset(gaps[-1][1], 0.0, "measured - simulated at one batch size")
    (b1, g1), (b2, g2) = gaps[0], gaps[-1]
    slope = max(0.0, (g2 - g1) / (b2 - b1))
    return Offset(g2 - slope * b2, slope, f"measured - simulated at batch sizes {b1} and {b2}")


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
    prior: Affine | None = None,
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
            if not result.ok:
                raise _SimulationFailed(result.error or "the simulated step failed")
        return int(offset.at(b) + runs[b].device_peak)

    def probe(b: int) -> Observation:
        total = predicted(b)
        fits = total <= budget_bytes
        out.trace.append({"batch_size": b, "fits": fits, "predicted_bytes": total, "seconds": runs[b].seconds})
        return Observation(b, fits, peak_bytes=total if fits else None, kind="fits" if fits else "oom")

    try:
        for b in report_at:
            out.points[str(b)] = predicted(b)
        result = search_max_batch(
            probe,
            budget_bytes=budget_bytes,
            max_batch_size=max_batch_size,
            batch_multiple=batch_multiple,
            prior=prior,
        )
    except _SimulationFailed as exc:
        out.status, out.error = "error", str(exc)
        return out
    out.status = result.status if result.status in ("exact", "capped", "infeasible") else "exact"
    out.max_batch_size = result.max_batch_size
    if result.model is not None:
        out.bytes_per_sample, out.intercept_bytes = result.model.slope, result.model.intercept
    at = result.max_batch_size or batch_multiple
    if at in runs:
        out.peak_bytes = predicted(at)
        out.categories = dict(runs[at].categories)
        out.static_bytes = dict(runs[at].static)
    line = _line(runs, offset)
    if line is not None:
        out.intercept_bytes, out.bytes_per_sample = line
    return out


def _line(runs: dict[int, SimResult], offset: Offset) -> tuple[float, float] | None:
    """Intercept and slope through the two largest simulated batch sizes (offset included)."""
    sizes = sorted(b for b, r in runs.items() if r.ok)
    if len(sizes) < 2:
        return None
    b1, b2 = sizes[-2], sizes[-1]
    y1 = offset.at(b1) + runs[b1].device_peak
    y2 = offset.at(b2) + runs[b2].device_peak
    slope = (y2 - y1) / (b2 - b1)
    return y2 - slope * b2, slope


class _SimulationFailed(Exception):
    pass

