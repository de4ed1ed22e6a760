"""The end game of the search: a narrow bracket, a model that says where the maximum probably is.

Once a non-fit bounds the bracket and it is at most :data:`WIDTH` candidates wide, :func:`propose` picks the
probe that minimises the expected number of probes still needed, the confirmation included, under the
model's distribution of the maximum (:func:`distribution`, :func:`best_probe`: an optimal binary search tree
over the bracket), instead of creeping towards the boundary one candidate at a time. A wrong distribution
costs probes, never correctness: the search still decides by feasibility alone (:mod:`autobatch.core.search`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autobatch.core.model import Prediction

#: The widest bracket (in candidates) the end game plans over (cubic in the width: 64 is ~50k steps).
WIDTH = 64
#: Weight of a uniform share in the distribution: a model that is wrong still leaves every candidate
#: some probability, so the plan degrades towards bisection rather than a creep.
DOUBT = 0.25
#: The smallest spread of the model's boundary, in candidates (measured on the CPU: the same batch's
#: peak differs by up to ~0.5 MiB between a 3-step probe and a 10-step one, a sample or two).
MIN_SPREAD = 0.75
#: An end-game probe runs as long as a confirmation when, should it fit, it is the maximum with at least
#: this probability (a fit of confirmation length, six to ten steps, costs two or three 3-step ones on the
#: CPU; a non-fit ends at its first out-of-memory step either way).
FINAL = 0.2
#: The end game plans over :data:`WIDTH` candidates around the boundary; it leaves the step to the model's
#: own rule when more than this share of the distribution lies outside them.
OUTSIDE = 0.25
#: The noise is read from the points this close to the model's boundary (a fraction of it): a curve that
#: bends (a rising phase's reading) is near-affine only there.
NEAR = 0.8


@dataclass(frozen=True)
class Bracket:
    """The search's bracket in index space (index i: batch ``(i + 1) * m``): ``lo`` fits, ``hi`` does not
    (``hi == n``: no non-fit known); ``lo_confirmed``: ``lo`` ran as long as a confirmation."""

    lo: int
    hi: int
    n: int
    m: int
    lo_confirmed: bool


@dataclass(frozen=True)
class Proposal:
    index: int
    fit_chance: float  # the distribution's probability that the probe fits (the maximum lies at it or above)
    answer_chance: float  # the distribution's probability that the maximum is the probe's candidate
    line_says_fits: bool  # what the model's own line says (a refuted "fits" makes the search distrust it)
    final: bool  # run it as long as a confirmation


def propose(
    bracket: Bracket, points: dict[int, int], prediction: Prediction, budget: int, jitter: int = 0
) -> Proposal | None:
    """The end game's probe, or None when it has nothing better than the model's own step: no slope, a
    flat run among the points near the boundary, or a boundary that may well lie outside the window.
    ``jitter``: how far the peak moved between probes near the boundary that the points do not show (bytes:
    :func:`autobatch.core.model.gap_jitter`), the least spread of the boundary."""
    lo, hi, m = bracket.lo, bracket.hi, bracket.m
    center = prediction.line.predict_max(budget)
    if center is None or not math.isfinite(center):
        return None
    reach = (hi - lo) * m  # an unbounded spread is as good as the bracket's width
    below = min(max(0.0, center - prediction.low), reach) / 2  # the interval as two standard deviations
    above = min(max(0.0, prediction.high - center), reach) / 2
    spread = noise(points, center, NEAR)
    if spread == math.inf:
        return None
    if spread is not None:  # the residuals near the boundary say it better than the interval's heuristics
        below = above = spread
    # Points of readings plus one gap are smooth where the peaks are not: a spread under the peaks' own jitter
    # had the plan expect a miss right above each fit, and the search crept up a sample a probe.
    least = jitter / prediction.line.slope
    below, above = max(below, least), max(above, least)
    # Plan over the candidates around the boundary: the stretches of the bracket below and above that
    # window count as one index each, which costs a search of its stretch and a confirmation.
    start = max(lo, min(int(center / m) - 1 - WIDTH // 2, hi - WIDTH))
    end = min(hi, start + WIDTH)
    if end - start < 2:
        return None
    weights = distribution(lo, hi, m, center, (below, above), (start, end), hi < bracket.n)
    if (weights[0] if start > lo else 0.0) + (weights[-1] if end < hi else 0.0) > OUTSIDE:
        return None
    base = (0 if bracket.lo_confirmed else 1) if start == lo else _ceil_log2(start - lo + 1) + 1
    top = 0 if end == hi else _ceil_log2(hi - end + 1) + 1
    offset = best_probe(weights, base, top)
    above_mass = sum(weights[offset:])
    # As long as a confirmation only when a fit there is likely the maximum (else a fit costs the extra
    # steps for nothing; the plan counted them as one probe either way).
    return Proposal(
        start + offset,
        fit_chance=above_mass,
        answer_chance=weights[offset],
        line_says_fits=center >= (start + offset + 1) * m,
        final=weights[offset] >= FINAL * above_mass,
    )


def noise(points: dict[int, int], center: float, near: float) -> float | None:
    """The model's noise in batch sizes: the largest residual of the points at or above ``near * center``
    from their least-squares line, over its slope (None: fewer than three such points; inf: they do not
    rise, as on an allocator's plateau: two of them equal, or the line's slope not positive). A peak under a
    smaller batch's is the noise between processes, which the residual measures (read as a plateau, it left
    the step to the model, which crept a sample a probe: the quadratic workload's seeded tunes at 0.2 MiB of
    noise took up to 14 probes, 12 since).

    A line through two close points amplifies their noise; the least-squares line through all the
    points near the boundary does not.
    """
    items = sorted((b, p) for b, p in points.items() if b >= near * center)
    if any(p1 == p2 for (_, p1), (_, p2) in zip(items, items[1:], strict=False)):
        return math.inf  # a flat run: the peaks are quantised (allocator segments), the line says little
    if len(items) < 3:
        return None
    mb = sum(b for b, _ in items) / len(items)
    mp = sum(p for _, p in items) / len(items)
    var = sum((b - mb) ** 2 for b, _ in items)
    slope = sum((b - mb) * (p - mp) for b, p in items) / var if var > 0 else 0.0
    if not slope > 0:
        return math.inf
    return max(abs(p - mp - slope * (b - mb)) for b, p in items) / slope


def distribution(
    lo: int,
    hi: int,
    m: int,
    center: float,
    spread: tuple[float, float],
    window: tuple[int, int],
    bounded: bool,
) -> list[float]:
    """Probabilities of each index of ``window = (start, end)`` being the maximum's (index i: batch
    ``(i + 1) * m``); the first also holds those of ``lo..start``, the last those of ``end-1..hi-1``.

    The boundary (the real batch where the peak meets the budget) is a two-piece normal around
    ``center`` with spreads ``spread = (below, above)`` (batch sizes, at least :data:`MIN_SPREAD`
    candidates), conditioned on the bracket (index ``lo`` fits; index ``hi`` does not, when ``bounded``),
    mixed with :data:`DOUBT` of a uniform share. The maximum is the largest candidate under the boundary.
    """
    (start, end), below, above = window, max(spread[0], MIN_SPREAD * m), max(spread[1], MIN_SPREAD * m)

    def cdf(x: float) -> float:
        if x <= center:
            return below / (below + above) * 2 * _phi((x - center) / below)
        return below / (below + above) + above / (below + above) * (2 * _phi((x - center) / above) - 1)

    width = end - start
    # P(boundary < candidate of index start + k), between the bracket's ends.
    inner = [cdf((start + k + 1) * m) for k in range(1, width)]
    edges = [cdf((lo + 1) * m), *inner, cdf((hi + 1) * m) if bounded else 1.0]
    mass = [max(0.0, edges[k + 1] - edges[k]) for k in range(width)]
    total = sum(mass)
    if total <= 1e-12:  # the model's boundary lies far outside the bracket: its nearer end
        mass = [0.0] * width
        mass[0 if center < (lo + 1) * m else -1] = 1.0
        total = 1.0
    counts = [start - lo + 1] + [1] * (width - 2) + [hi - end + 1 if bounded else 1]
    share = sum(counts)
    return [(1 - DOUBT) * p / total + DOUBT * c / share for p, c in zip(mass, counts, strict=False)]


def best_probe(weights: list[float], base_cost: float, top_cost: float = 0.0) -> int:
    """The offset (1..len-1) of the probe that minimises the expected probes left in the bracket.

    ``weights[k]``: the probability that the maximum is the bracket's k-th index (0: its fitting end).
    Probing offset j splits ``[a, b)`` into ``[a, j)`` (a non-fit) and ``[j, b)`` (a fit). A bracket of
    one index is done, every end-game probe running as long as a confirmation; ``base_cost``: the
    probes still needed when it ends at index 0 (0: it ran as long as a confirmation; 1: it did not;
    more when index 0 stands for a stretch of the bracket below the window planned over); ``top_cost``:
    those when it ends at the last index and that stands for a stretch above the window.

    When the weights sit at the top of the bracket, the best probe is the candidate right under the known
    non-fit: one probe, if it fits.
    """
    width = len(weights)
    if width < 2:
        raise ValueError("a bracket with nothing left to probe")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # cost[a][b]: probability-weighted probes still needed for the sub-bracket [a, b).
    cost = [[0.0] * (width + 1) for _ in range(width + 1)]
    choice = [[0] * (width + 1) for _ in range(width + 1)]
    cost[0][1] = base_cost * weights[0]
    cost[width - 1][width] += top_cost * weights[-1]
    for span in range(2, width + 1):
        for a in range(0, width - span + 1):
            b = a + span
            best, where = math.inf, a + 1
            for j in range(a + 1, b):
                c = cost[a][j] + cost[j][b]
                if c < best:
                    best, where = c, j
            cost[a][b] = prefix[b] - prefix[a] + best
            choice[a][b] = where
    return choice[0][width]


def _ceil_log2(x: int) -> int:
    return (x - 1).bit_length()


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))
