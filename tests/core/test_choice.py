"""The throughput choice's pure decisions: dominance, enough steps, ties by the user's order, the margin."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.choice import NOISE_Z, RSE_BOUND, Contender, Timing, decide, dominated, needs_more


def contender(
    index: int, recompute: bool, max_batch: int, micro: int, precision: str = "32-true"
) -> Contender:
    return Contender(index, precision, "adamw", recompute, max_batch, micro, 1)


def test_recompute_is_dropped_when_its_twin_fits_the_micro_batch() -> None:
    # Global batch 64: both plan micro 64; the twin's maximum (100) fits it, so recomputation cannot win.
    assert dominated([contender(0, False, 100, 64), contender(1, True, 180, 64)]) == {1: 0}


def test_recompute_stays_when_it_alone_fits_the_micro_batch() -> None:
    assert dominated([contender(0, False, 100, 100), contender(1, True, 180, 180)]) == {}
    # another precision is no twin
    assert dominated([contender(0, False, 100, 64, "bf16-mixed"), contender(1, True, 180, 64)]) == {}


def timing(index: int, mean: float, spread: float, n: int, micro: int = 64, seed: int = 0) -> Timing:
    rng = random.Random(seed * 7919 + index)
    return Timing(index, micro, 1, tuple(mean * (1 + rng.uniform(-spread, spread)) for _ in range(n)))


def test_a_clear_winner_reports_its_margin() -> None:
    decision = decide([timing(0, 2.0, 0.01, 9), timing(1, 1.0, 0.01, 9)])
    assert decision is not None and decision.winner == 1 and decision.runner_up == 0
    assert not decision.tie
    assert decision.margin is not None and 0.9 < decision.margin < 1.1  # about twice as fast


def test_within_the_noise_the_users_order_wins() -> None:
    # index 1 is 3 % faster on average, but its steps vary by +-30 %: a tie, settled by order.
    decision = decide([timing(0, 1.03, 0.3, 6), timing(1, 1.0, 0.3, 6)])
    assert decision is not None and decision.winner == 0 and decision.tie
    assert decision.runner_up == 1 and decision.margin is not None and decision.margin < 0


def test_needs_more_names_uncertain_contenders_still_in_reach() -> None:
    noisy = [timing(0, 1.0, 0.4, 3), timing(1, 1.05, 0.4, 3), timing(2, 10.0, 0.4, 3)]
    assert needs_more(noisy) == [0, 1]  # index 2 is ten times slower: out of reach whatever the noise
    settled = [timing(0, 1.0, 0.001, 20), timing(1, 1.05, 0.001, 20)]
    assert all(t.rse <= RSE_BOUND for t in settled)
    assert needs_more(settled) == []
    assert needs_more([timing(0, 1.0, 0.4, 3)]) == []  # a single contender needs no timing


@settings(max_examples=200, deadline=None)
@given(
    means=st.lists(st.floats(0.5, 2.0), min_size=2, max_size=5),
    spread=st.floats(0.0, 0.5),
    n=st.integers(2, 30),
    seed=st.integers(0, 1000),
)
def test_the_winner_is_never_slower_beyond_the_noise(
    means: list[float], spread: float, n: int, seed: int
) -> None:
    timings = [timing(i, m, spread, n, seed=seed) for i, m in enumerate(means)]
    decision = decide(timings)
    assert decision is not None
    best = max(timings, key=lambda t: t.rate)
    won = timings[decision.winner]
    assert best.rate - won.rate <= NOISE_Z * (best.rate_se**2 + won.rate_se**2) ** 0.5 + 1e-9
    # Nothing earlier in the user's order ties with the fastest and was passed over.
    for earlier in timings[: decision.winner]:
        assert best.rate - earlier.rate > NOISE_Z * (best.rate_se**2 + earlier.rate_se**2) ** 0.5 - 1e-9
