"""The end game of the search: a narrow bracket, a model that says where the maximum probably is.

Near the boundary the model's prediction is sharp but not exact (on the CPU the peak of the same batch
differs by a fraction of a MiB between processes and over a probe's steps), and stepping under the
prediction one candidate at a time creeps towards a boundary from below, one probe per sample. Once a
non-fit bounds the bracket and it is at most :data:`WIDTH` candidates wide, the search instead picks
the probe that minimises the *expected* number of probes still needed, the confirmation included,
under the model's distribution of the maximum (:func:`distribution`): an optimal binary search tree over
the bracket (:func:`best_probe`). Every probe of the end game runs as long as a confirmation, so a fit
next to a known non-fit ends the search in that probe. When the distribution sits at the top of the
bracket, the best probe is the candidate right under the known non-fit: one probe, if it fits.

A wrong distribution costs probes, never correctness: the search still decides by feasibility alone,
and its debt keeps the worst-case bound (:mod:`autobatch.core.search`).
"""

from __future__ import annotations

import math

#: The widest bracket (in candidates) the end game plans over (cubic in the width: 64 is ~50k steps).
WIDTH = 64
#: Weight of a uniform share in the distribution: a model that is wrong still leaves every candidate
#: some probability, so the plan degrades towards bisection rather than a creep.
DOUBT = 0.25
#: The smallest spread of the model's boundary, in candidates (measured on the CPU: the same batch's
#: peak differs by up to ~0.5 MiB between a 3-step probe and a 10-step one, a sample or two).
MIN_SPREAD = 0.75


def distribution(lo: int, hi: int, m: int, center: float, below: float, above: float) -> list[float]:
    """Probabilities of each index ``lo..hi-1`` being the maximum's, candidates ``(i + 1) * m``.

    The boundary (the real batch where the peak meets the budget) is a two-piece normal around
    ``center`` with spreads ``below`` and ``above`` (batch sizes, at least :data:`MIN_SPREAD` candidates),
    conditioned on the bracket, mixed with :data:`DOUBT` of a uniform share. The maximum is the largest candidate at or under the boundary.
    """
    below, above = max(below, MIN_SPREAD * m), max(above, MIN_SPREAD * m)

    def cdf(x: float) -> float:
        if x <= center:
            return below / (below + above) * 2 * _phi((x - center) / below)
        return below / (below + above) + above / (below + above) * (2 * _phi((x - center) / above) - 1)

    width = hi - lo
    # P(boundary < candidate of index lo + k), conditioned on the bracket (index lo fits, hi does not).
    edges = [cdf((lo + k + 1) * m) for k in range(width + 1)]
    mass = [max(0.0, edges[k + 1] - edges[k]) for k in range(width)]
    total = sum(mass)
    if total <= 1e-12:  # the model's boundary lies far outside the bracket: its nearer end
        mass = [0.0] * width
        mass[0 if center < (lo + 1) * m else -1] = 1.0
        total = 1.0
    return [(1 - DOUBT) * p / total + DOUBT / width for p in mass]


def best_probe(weights: list[float], lo_confirmed: bool) -> int:
    """The offset (1..len-1) of the probe that minimises the expected probes left in the bracket.

    ``weights[k]``: the probability that the maximum is the bracket's k-th index (0: its fitting end).
    Probing offset j splits ``[a, b)`` into ``[a, j)`` (a non-fit) and ``[j, b)`` (a fit). A bracket of
    one index is done; it costs one confirmation more when that index is the bracket's original fitting
    end and had not run as long as a confirmation (every end-game probe does).
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
    cost[0][1] = 0.0 if lo_confirmed else weights[0]
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


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))
