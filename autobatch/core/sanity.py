"""Checks that a combination's answer can be trusted: limited by memory, not by a crash; peaks that grow.

Pure, over the probes a combination ran as ``(batch, kind, peak)`` triples: :func:`limited_by` finds a maximum
bounded by a crash or a timeout rather than by memory (the combination is then ``crash-limited`` or
``timeout-limited``), :func:`flat_peaks` and :func:`batch_ignored` a batch that never reached the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autobatch.core.step_peaks import Reading
from autobatch.core.units import format_bytes

#: Kinds that are not an answer about memory.
NOT_MEMORY = ("crash", "timeout")
#: Fitting batches this far apart whose peaks barely differ are suspicious.
FLAT_RATIO = 4
#: Fitting batches this far apart whose peaks and step times do not move at all never reached the step. Three
#: orders of magnitude: a small model's step at batch 8 and at 256 can both be its fixed costs (a 256-wide
#: linear layer: the same peak and step time here), at 8 and 8192 it cannot; the search spans such a range
#: only when it extrapolates flat peaks to the largest batch it may try.
IGNORED_RATIO = 1024
#: A step time that grows by less than this factor over :data:`IGNORED_RATIO` x the batch did not move.
STILL_TIME = 1.5

Point = tuple[int, str, "int | None"]


@dataclass(frozen=True)
class Limit:
    """What bounds a maximum from above when it is not memory."""

    kind: str  # "crash" | "timeout"
    batch_size: int

    @property
    def status(self) -> str:
        return f"{self.kind}-limited"

    def reason(self, max_batch_size: int | None) -> str:
        what = "a crash" if self.kind == "crash" else "a timeout"
        below = (
            f"; {max_batch_size} is the largest batch that fitted below it (the memory maximum may be higher)"
            if max_batch_size is not None
            else ""
        )
        return (
            f"limited by {what} at batch {self.batch_size}, not by memory (it happened twice, each time in a "
            f"fresh process){below}"
        )


def limited_by(points: Sequence[Point], max_batch_size: int | None) -> Limit | None:
    """The crash or timeout that bounds the maximum, if the smallest non-fit above it is one.

    A maximum is only a memory maximum when the smallest batch known not to fit above it ran out of memory.
    When that batch crashed or timed out (after one retry in a fresh process), the combination's status
    becomes ``crash-limited`` or ``timeout-limited`` and the tune exits with the probe-failure code."""
    above = [
        (b, kind)
        for b, kind, _ in points
        if kind != "fits" and (max_batch_size is None or b > max_batch_size)
    ]
    if not above:
        return None
    smallest = min(b for b, _ in above)
    kinds = {kind for b, kind in above if b == smallest}
    if kinds & {"oom", "error"}:
        return None
    kind = "crash" if "crash" in kinds else "timeout"
    return Limit(kind, smallest)


def flat_bytes(budget_bytes: int) -> int:
    """Growth under which peaks count as flat: ``max(2 MiB, budget / 500)``."""
    return max(2 << 20, budget_bytes // 500)


#: What the flat-peaks warning asks of a three-function script.
MAKE_BATCH_QUESTION = "does make_batch use its batch_size?"


def flat_peaks(points: Sequence[Point], budget_bytes: int, question: str = MAKE_BATCH_QUESTION) -> str | None:
    """A warning when the peaks of fitting probes do not grow over a :data:`FLAT_RATIO` x range; ``question``
    asks whether the batch reaches the step (a script run as it is: in its own words).

    Flat peaks usually mean that ``make_batch`` ignores its argument (its size check turned off), which makes
    any batch "fit". A parameter-heavy model can be flat over a small range while the optimizer step sets the
    peak; a 4x range with less than :func:`flat_bytes` of growth is what the warning asks about."""
    fits = sorted((b, peak) for b, kind, peak in points if kind == "fits" and peak is not None)
    if len(fits) < 2:
        return None
    (small, p_small), (large, p_large) = fits[0], fits[-1]
    if large < FLAT_RATIO * small or p_large - p_small >= flat_bytes(budget_bytes):
        return None
    return (
        f"peaks did not grow with the batch ({format_bytes(p_small)} at batch {small}, {format_bytes(p_large)} "
        f"at batch {large}): {question} If it does, the optimizer step sets the peak over this range and the "
        "maximum stands"
    )


def batch_ignored(readings: Sequence[Reading], threshold_bytes: int) -> str | None:
    """What shows that the batch never reached the step (None: it did, or the probes cannot tell): the
    smallest and the largest fitting batch, at least :data:`IGNORED_RATIO` x apart, whose peaks (and forward and
    backward phase's peaks, when measured) differ by less than ``threshold_bytes`` and whose step times differ
    by less than :data:`STILL_TIME` x. Without step times at both, it cannot tell."""
    fits = sorted(
        (r for r in readings if r.kind == "fits" and r.peak_bytes is not None), key=lambda r: r.batch_size
    )
    if len(fits) < 2:
        return None
    small, large = fits[0], fits[-1]
    if large.batch_size < IGNORED_RATIO * small.batch_size or not (small.step_seconds and large.step_seconds):
        return None
    assert small.peak_bytes is not None and large.peak_bytes is not None
    if abs(large.peak_bytes - small.peak_bytes) >= threshold_bytes:
        return None
    if small.phase_bytes is not None and large.phase_bytes is not None:
        if abs(large.phase_bytes - small.phase_bytes) >= threshold_bytes:
            return None
    if large.step_seconds >= STILL_TIME * small.step_seconds:
        return None
    return (
        f"peaks and step times did not move from batch {small.batch_size} to batch {large.batch_size} "
        f"({large.batch_size // small.batch_size:,}x the samples): {format_bytes(small.peak_bytes)} and "
        f"{small.step_seconds:.3f} s a step at batch {small.batch_size}, {format_bytes(large.peak_bytes)} and "
        f"{large.step_seconds:.3f} s at batch {large.batch_size}"
    )
