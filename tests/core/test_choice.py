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


def test_probes_that_disagree_widen_the_error_their_steady_steps_understate() -> None:
    # Issue 14's root tune on a busy machine: three probes of 7 steps each, steady within a probe
    # (+-2 %), but at 10.5, 14.2 and 17.1 samples/s from one probe to the next (micro-batch 32).
    rates = (10.5, 14.2, 17.1)
    steps = tuple(32 / r * f for r in rates for f in (0.98, 1.0, 1.02, 0.99, 1.01, 1.0, 1.0))
    means = tuple(32 / r for r in rates)
    alone, probed = Timing(1, 32, 1, steps), Timing(1, 32, 1, steps, means)
    assert alone.rse < 0.1 < probed.rse  # the steps' own error misses the load between probes
    assert probed.rate == alone.rate
    # Against a steadier rival at 9.8 samples/s (timed by three probes too): a tie by the probes' error,
    # settled by the user's order; by the steps' error alone it looked like a +37 % win.
    rival_means = (32 / 11.1, 32 / 9.3, 32 / 9.2)
    rival_steps = tuple(m * f for m in rival_means for f in (0.98, 1.0, 1.02, 0.99, 1.01, 1.0, 1.0))
    rival = Timing(0, 32, 1, rival_steps, rival_means)
    by_steps = decide([Timing(0, 32, 1, rival_steps), alone])
    by_probes = decide([rival, probed])
    assert by_steps is not None and by_steps.winner == 1 and not by_steps.tie
    assert by_probes is not None and by_probes.winner == 0 and by_probes.tie


def test_probes_that_agree_change_nothing() -> None:
    steps = tuple(0.1 * (1 + 0.05 * ((i % 3) - 1)) for i in range(21))
    t = Timing(0, 8, 1, steps, (0.1, 0.1001, 0.0999))
    assert t.rse == Timing(0, 8, 1, steps).rse
    assert Timing(0, 8, 1, steps, (0.1,)).rse == Timing(0, 8, 1, steps).rse  # one probe: nothing to add


def test_a_contender_one_probe_timed_is_timed_again_while_in_reach() -> None:
    steady = tuple(0.5 * (1 + 0.01 * (i % 3)) for i in range(7))  # its steps alone: under the bound
    one = Timing(0, 16, 1, steady, (0.5,))
    two = Timing(1, 16, 1, steady * 2, (0.5, 0.505))
    assert one.rse <= RSE_BOUND and two.rse <= RSE_BOUND
    assert needs_more([one, two]) == [0]
    # One probe at ten times the step time is timed again too: a single probe can be a burst of load
    # (the root tune measured 33.4 samples/s at micro-batch 16 after 10.1 at 27 in the search).
    far = Timing(1, 16, 1, tuple(s * 10 for s in steady), (5.0,))
    assert needs_more([Timing(0, 16, 1, steady * 2, (0.5, 0.505)), far]) == [1]
    far_twice = Timing(1, 16, 1, tuple(s * 10 for s in steady * 2), (5.0, 5.05))
    assert needs_more([Timing(0, 16, 1, steady * 2, (0.5, 0.505)), far_twice]) == []
