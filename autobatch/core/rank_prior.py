"""A strategy's first probe from the single-process curve (pure).

A tune with ``--strategy ddp|fsdp`` pays N rank processes for every probe. When the same script, arguments
and combination were already measured in one process, their memory line predicts one rank's
(:func:`rank_line`), and :func:`strategy_prior` gives it to the search as a prior like
:mod:`autobatch.core.reuse`'s: the search still brackets and confirms, so a wrong prior costs probes, never
correctness.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autobatch.core.maximum import StaticMemory
from autobatch.core.model import Affine
from autobatch.core.reuse import Prediction
from autobatch.core.search import Observation

__all__ = [
    "GLOO_RANK_BYTES",
    "RankState",
    "basis",
    "curve_of",
    "fit_line",
    "per_rank",
    "rank_line",
    "strategy_prior",
]

#: What a rank process holds beyond a single probe process before building the model, on the CPU device
#: (``gloo``) (docs/measurements/in-the-code.md). On CUDA, NCCL's buffers lie outside the caching allocator whose peak a probe
#: measures, so nothing is added there.
GLOO_RANK_BYTES = 23 * 2**20


@dataclass(frozen=True)
class RankState:
    """One process's static memory (bytes), as the model's inspection and the analytic optimizer state give it.

    ``largest_block``: parameter bytes of the largest block FSDP wraps (0: unknown or none);
    ``unblocked``: parameter bytes outside every block (the root's own, which FSDP2 keeps gathered).
    """

    parameters: int
    gradients: int
    optimizer_state: int
    largest_block: int = 0
    unblocked: int = 0

    @property
    def sharded(self) -> int:
        """What FSDP shards: parameters, gradients and optimizer state."""
        return self.parameters + self.gradients + self.optimizer_state


def basis(strategy: str, world: int) -> str:
    """Where the prior came from, for the progress line and the result's notes."""
    if strategy == "fsdp":
        return f"prior from the single-process curve, sharded state / {world}"
    return f"prior from the single-process curve, + gradient buckets ({strategy} on {world} ranks)"


def fit_line(points: Sequence[tuple[int, int]]) -> Affine | None:
    """The least-squares line through (batch, peak) points; None with fewer than two batches or a slope
    that is not positive (a plateau says nothing about the per-sample cost)."""
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_p = sum(p for _, p in points) / n
    sxx = sum((b - mean_b) ** 2 for b, _ in points)
    sxy = sum((b - mean_b) * (p - mean_p) for b, p in points)
    slope = sxy / sxx
    if not slope > 0:
        return None
    return Affine(mean_p - slope * mean_b, slope)


def curve_of(observations: Iterable[Observation]) -> Affine | None:
    """The single-process line from its probes, read as the search reads them: only fits below the
    smallest non-fit count, and the rising phase's peaks (forward and backward with the optimizer state
    resident) when every fit has one, since the optimizer step's flat peak hides the slope. The line is
    fitted to the upper half of the fitting batches (all of them when that leaves one batch): at small
    batches the build's transients hold the rising phase's high-water mark flat
    (docs/measurements/in-the-code.md)."""
    seen = list(observations)
    min_fail = min((o.batch_size for o in seen if not o.fits), default=None)
    fits = [
        o
        for o in seen
        if o.fits and o.peak_bytes is not None and (min_fail is None or o.batch_size < min_fail)
    ]
    rising = bool(fits) and all(o.rising_bytes is not None for o in fits)
    points = [(o.batch_size, int((o.rising_bytes if rising else o.peak_bytes) or 0)) for o in fits]
    top = max((b for b, _ in points), default=0)
    upper = [(b, p) for b, p in points if 2 * b >= top]
    return fit_line(upper) or fit_line(points)


def rank_line(single: Affine, strategy: str, world: int, state: RankState, runtime_bytes: int = 0) -> Affine:
    """One rank's line under ``strategy`` on ``world`` ranks, from the single-process line
    ``peak(b) = intercept + slope * b``.

    * **slope**: unchanged. Every rank runs its own micro-batch through the whole model, so it keeps the
      single process's activations per sample.
    * **intercept, FSDP2** (``fully_shard`` per block, then the root): parameters, gradients and optimizer
      state are sharded, so each rank holds ``1/N`` of them: the intercept drops by
      ``(parameters + gradients + optimizer state) x (1 - 1/N)``. In exchange the block being computed is
      all-gathered (its parameters, and in backward its unsharded gradients before the reduce-scatter), and
      the root keeps its own parameters gathered from forward to backward (FSDP2's default for the root).
    * **intercept, DDP**: gradient buckets, a flat copy of every gradient beside the gradients
      (``gradient_as_bucket_view=False``, the default): ``+ gradients``.
    * both: the process group's own memory per rank (``runtime_bytes``, given by the caller).
    """
    if world < 2 or strategy not in ("ddp", "fsdp"):
        raise ValueError(f"a strategy prior needs ddp or fsdp on at least 2 ranks, got {strategy} on {world}")
    if strategy == "fsdp":
        keep = 1 - 1 / world
        gathered = 2 * state.largest_block  # one block's parameters and its unsharded gradients
        shift = -state.sharded * keep + gathered + state.unblocked * keep
    else:
        shift = state.gradients
    return Affine(single.intercept + shift + runtime_bytes, single.slope)


def strategy_prior(
    single: Affine | None, strategy: str, world: int, state: RankState, runtime_bytes: int = 0
) -> Prediction | None:
    """The search's prior for one rank (the slope is the measured single-process one); None without a curve."""
    if single is None or strategy not in ("ddp", "fsdp") or world < 2:
        return None
    line = rank_line(single, strategy, world, state, runtime_bytes)
    return Prediction(line.intercept, line.slope, basis(strategy, world))


def per_rank(static: StaticMemory, strategy: str, world: int) -> StaticMemory:
    """One rank's share of static memory: FSDP holds ``1/N`` of the parameters, gradients and optimizer
    state (the search reads a miss's rising phase with it and floors its guesses by it); DDP and one process
    hold them whole."""
    if strategy != "fsdp" or world < 2:
        return static
    return StaticMemory(
        static.parameters // world, static.gradients // world, static.optimizer_state // world
    )
