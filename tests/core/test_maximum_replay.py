"""Which probes of a real tune run as long as a confirmation (issue 33: none over six), replayed through
:func:`~autobatch.core.maximum.find_maximum`: ``tests/scripts/as_is/loader_workers.py`` on the CPU under 512 MiB
with 10 % headroom (2026-12-01). Each probe is answered with what the tune measured at that batch and length.
No torch.
"""

from __future__ import annotations

from autobatch.core.maximum import Limits, find_maximum
from autobatch.core.search import Observation

BUDGET = 480_038_092  # the search's line: 512 MiB less the headroom and the CPU margin
FLOOR = 306_765_960
STATIC = 307_859_632
LIMITS = Limits(max_batch_size=65536, batch_multiple=1, steps=3, max_steps=8, confirm_steps=10)


def fit(batch: int, peak: int, rising: int, steps: int) -> Observation:
    return Observation(batch, True, peak_bytes=peak, steps=steps, rising_bytes=rising, static_bytes=STATIC)


def miss(batch: int, peak: int, rising: int, steps: int) -> Observation:
    return Observation(batch, False, kind="oom", peak_bytes=peak, steps=steps, rising_bytes=rising)


def test_a_probe_two_under_a_miss_runs_as_long_as_its_confirmation() -> None:
    # After a long fit at 7183 and misses at 7188 and 7187, the end game's bisection probed 7185 for 3 steps; it
    # fitted, 7186 (next to the miss, as long as a confirmation) did not, and 7185 ran again as its
    # confirmation: 9 probes. As long, a fit at 7185 is the answer or 7186 is: no confirmation either way.
    measured = {
        (8, False): fit(8, 365_334_528, 363_171_936, 3),
        (23, False): fit(23, 364_630_016, 362_704_992, 3),
        (1694, False): fit(1694, 390_078_464, 390_090_848, 3),
        (7183, True): fit(7183, 479_965_184, 480_047_200, 6),
        (7188, True): miss(7188, 480_063_488, 480_145_504, 3),
        (7187, True): miss(7187, 480_071_680, 480_153_696, 2),
        (7185, False): fit(7185, 480_034_816, 480_116_832, 3),
        (7185, True): fit(7185, 480_034_816, 480_116_832, 6),
        (7186, True): miss(7186, 480_051_200, 480_133_216, 2),
    }
    asked: list[tuple[int, bool]] = []

    def probe(batch: int, steps: tuple[int, int], purpose: str) -> Observation:
        key = (batch, steps[0] >= LIMITS.confirm[0])
        asked.append(key)
        return measured[key]

    answer = find_maximum(probe, budget_bytes=BUDGET, limits=LIMITS, floor_bytes=FLOOR)
    assert (answer.max_batch_size, answer.status) == (7185, "exact")
    assert asked[-2:] == [(7185, True), (7186, True)] and answer.probes == 8
