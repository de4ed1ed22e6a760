"""Probes per curve family for the per-combination procedure (pure: fake probes, seconds).

``python scripts/probe_counts.py`` prints, per synthetic curve, the probes ``find_maximum`` makes
(confirmation included) and whether the answer is the true maximum. Run it before and after a change to
the search: each idea is measured before it goes in.
"""

from __future__ import annotations

import statistics

from autobatch.core.maximum import Limits, find_maximum
from autobatch.testing import FakeStepProbe, affine, noisy, plateau, quadratic, staircase, true_max

GiB, MiB = 2**30, 2**20
LIMITS = Limits(max_batch_size=65536, batch_multiple=1, steps=3, max_steps=8, confirm_steps=10)

CURVES = {
    "affine": affine(300 * MiB, 1.5 * MiB),
    "quadratic": quadratic(300 * MiB, 0.2 * MiB, 0.002 * MiB),
    "staircase": staircase(300 * MiB, 1.3 * MiB, 20 * MiB),
    "noisy affine": noisy(affine(300 * MiB, 1.5 * MiB), 0.02, seed=1),
    "flat-then-rising": plateau(900 * MiB, 100 * MiB, 0.5 * MiB),
}


def count(name: str, phases: bool) -> tuple[int, bool, list[int]]:
    curve = CURVES[name]
    probe = FakeStepProbe(curve, GiB, phases=phases)
    answer = find_maximum(probe, budget_bytes=GiB, limits=LIMITS)
    exact = answer.max_batch_size == true_max(curve, GiB, LIMITS.max_batch_size)
    return answer.probes, exact, [b for b, _, _ in probe.calls]


def main() -> None:
    for phases in (False, True):
        print(f"phase peaks reported: {phases}")
        counts = []
        for name in CURVES:
            probes, exact, calls = count(name, phases)
            counts.append(probes)
            print(f"  {name:18s} {probes:3d} probes  exact={exact}  {calls}")
        print(f"  median {statistics.median(counts)}, max {max(counts)}")


if __name__ == "__main__":
    main()
