"""The throughput choice's pure decisions: dominance, enough steps, ties by the user's order, the margin."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.choice import (
    EQUIVALENT,
    NOISE_Z,
    QUIET_WAIT,
    RSE_BOUND,
    T_975,
    Contender,
    Timing,
    decide,
    dominated,
    needs_more,
    preference,
    quiet,
)


def contender(
    index: int, recompute: bool | str, max_batch: int, micro: int, precision: str = "32-true"
) -> Contender:
    level = recompute if isinstance(recompute, str) else "full" if recompute else "off"
    return Contender(index, precision, "adamw", level, max_batch, micro, 1)


def test_a_level_is_dropped_for_one_that_recomputes_less_and_fits_its_micro_batch() -> None:
    # off fits 40; the plan needs 48: off cannot run it, 4/12 (max 50), selective (55) and full (80) can.
    levels = [contender(0, "off", 40, 40), contender(1, "4/12", 50, 48), contender(2, "selective", 55, 48)]
    levels += [contender(3, "full", 80, 48), contender(4, "8/12", 60, 48)]
    dropped = dominated(levels)
    assert dropped == {3: 1, 4: 1}  # full and 8/12 for 4/12 (off is too small); selective vs 4/12: timed
    assert 2 not in dropped and 1 not in dropped


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


def test_a_plan_that_accumulates_pays_its_update_once_per_global_batch() -> None:
    # A probe's step is forward, backward and update (0.2 of 1.0 s); a job that accumulates 4 micro-batches
    # runs 4 forwards and backwards and one update: 4 x 0.8 + 0.2 = 3.4 s per global batch of 4 x 16.
    probes = (1.0, 1.0)
    plan = Timing(0, 16, 1, (1.0,) * 6, probes, accumulation_steps=4, update_seconds=(0.2, 0.2))
    assert abs(plan.global_time - 3.4) < 1e-9 and abs(plan.rate - 64 / 3.4) < 1e-9
    unmeasured = Timing(0, 16, 1, (1.0,) * 6, probes, accumulation_steps=4)  # a script run as it is
    assert abs(unmeasured.global_time - 4.0) < 1e-9
    # against one micro-batch of 64 at 3.5 s per step: the accumulating plan is faster, as in the job
    one = Timing(1, 64, 1, (3.5,) * 6, (3.5, 3.5), update_seconds=(0.2, 0.2))
    decision = decide([plan, one])
    assert decision is not None and decision.winner == 0


def test_a_tie_goes_to_the_least_recomputation_of_a_precision_and_optimizer() -> None:
    # The user's order lists full before 4/12 (the default grid: off, full, selective, partial); tied, the
    # level that recomputes less wins; another precision listed first still wins a tie against both.
    levels = [contender(0, "off", 8, 4), contender(1, "full", 40, 16), contender(2, "4/12", 20, 16)]
    order = preference(levels)
    assert sorted(order, key=order.__getitem__) == [0, 2, 1]
    tied = [timing(1, 1.0, 0.0, 6, micro=16), timing(2, 1.01, 0.0, 6, micro=16)]
    decision = decide(tied, order)
    assert decision is not None and decision.winner == 2 and decision.tie
    other = [
        contender(0, "off", 8, 4, "bf16-mixed"),
        contender(1, "full", 40, 16),
        contender(2, "4/12", 20, 16),
    ]
    assert min(preference(other), key=preference(other).__getitem__) == 0


def probed(index: int, mean: float, spread: float) -> Timing:
    """Two probes of three steps each (what a contender has before the choice's rounds)."""
    one, two = timing(index, mean, spread, 3, seed=1), timing(index, mean, spread, 3, seed=2)
    return Timing(index, 64, 1, one.step_seconds + two.step_seconds, (one.step_time, two.step_time))


def test_needs_more_names_uncertain_contenders_still_in_reach() -> None:
    noisy = [probed(0, 1.0, 0.4), probed(1, 1.05, 0.4), probed(2, 10.0, 0.4)]
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

    def tie_width(a: Timing, b: Timing) -> float:
        z = T_975.get(min(a.samples, b.samples) - 1, NOISE_Z)
        return max(EQUIVALENT * max(a.rate, b.rate), z * (a.rate_se**2 + b.rate_se**2) ** 0.5)

    assert best.rate - won.rate <= tie_width(best, won) + 1e-9
    # Nothing earlier in the user's order ties with the fastest and was passed over.
    for earlier in timings[: decision.winner]:
        assert best.rate - earlier.rate > tie_width(best, earlier) - 1e-9


def loaded_probes(cost: float, rng: random.Random, probes: int = 3, steps: int = 6) -> Timing:
    """A contender whose step costs ``cost`` seconds, timed on a machine where another process takes the
    core now and then: each step is delayed with probability 1/2 by up to 1.5x its cost, and each probe
    shares one stretch of slower machine (up to 1.1x on every step of it). Load only ever adds time."""
    seconds, fastest = [], []
    for _ in range(probes):
        stretch = 1 + rng.uniform(0, 0.1)
        timed = [
            cost * stretch + (rng.uniform(0, 1.5) * cost if rng.random() < 0.5 else 0.0) for _ in range(steps)
        ]
        seconds += timed
        fastest.append(min(timed))
    return Timing(0, 32, 1, tuple(seconds), tuple(fastest))


def test_load_cannot_flip_a_real_difference_that_the_mean_flips() -> None:
    # Contender 0 is truly 12 % faster per sample than contender 1 (same micro-batch). On a loaded
    # machine the mean step time picks the slower one often; the probes' fastest steps never do.
    rng = random.Random(14)
    mean_flips = fastest_flips = 0
    for _ in range(300):
        a, b = loaded_probes(1.0, rng), loaded_probes(1.12, rng)
        a, b = (
            Timing(0, 32, 1, a.step_seconds, a.probe_seconds),
            Timing(1, 32, 1, b.step_seconds, b.probe_seconds),
        )
        mean_a, mean_b = (sum(t.step_seconds) / len(t.step_seconds) for t in (a, b))
        mean_flips += mean_b < mean_a
        decision = decide([a, b])
        assert decision is not None
        fastest_flips += decision.winner == 1
    assert mean_flips >= 30  # the mean follows the load
    assert fastest_flips == 0


def test_two_equal_contenders_go_to_the_users_order_whatever_the_load() -> None:
    rng = random.Random(7)
    order = 0
    for _ in range(300):
        a, b = loaded_probes(1.0, rng), loaded_probes(1.0, rng)
        decision = decide(
            [
                Timing(0, 32, 1, a.step_seconds, a.probe_seconds),
                Timing(1, 32, 1, b.step_seconds, b.probe_seconds),
            ]
        )
        assert decision is not None
        order += decision.winner == 0
    assert order >= 0.97 * 300  # the mean step time gives each about half


def test_within_the_equivalence_band_it_is_a_tie_however_precise() -> None:
    exact_a, exact_b = Timing(0, 8, 1, (0.104,) * 9, (0.104,) * 3), Timing(1, 8, 1, (0.1,) * 9, (0.1,) * 3)
    assert exact_a.rse == exact_b.rse == 0.0
    decision = decide([exact_a, exact_b])  # index 1 is 4 % faster: within EQUIVALENT, the user's order
    assert decision is not None and decision.winner == 0 and decision.tie
    clear = decide([Timing(0, 8, 1, (0.11,) * 9, (0.11,) * 3), exact_b])  # 10 % faster: a real win
    assert clear is not None and clear.winner == 1 and not clear.tie


def test_one_probes_error_is_the_spread_of_its_fastest_half() -> None:
    steps = (0.1, 0.102, 0.101, 0.25, 0.3, 0.4)  # three steps hit by load: they do not count
    t = Timing(0, 8, 1, steps, (0.1,))
    assert t.step_time == 0.1 and t.rse < 0.01
    assert Timing(0, 8, 1, steps).step_time == 0.1  # without per-probe records: the fastest step
    assert Timing(0, 8, 1, (0.1,)).rse == float("inf")


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


def test_one_probe_on_a_quiet_machine_is_enough() -> None:
    """A probe none of whose threads waited for a core measured the step's own cost: a clear difference is
    decided without timing anyone again, and a tie within the equivalence band goes to the user's order;
    a probe whose threads waited (a busy neighbour) is timed again (the load between probes is unknown)."""
    steady = tuple(0.5 * (1 + 0.01 * (i % 3)) for i in range(7))
    fast = Timing(0, 16, 1, steady, (0.5,), (0.003,))
    slow = Timing(1, 16, 1, tuple(s * 3 for s in steady), (1.5,), (0.01,))
    assert needs_more([fast, slow]) == []
    decision = decide([fast, slow])
    assert decision is not None and (decision.winner, decision.tie, decision.busy) == (0, False, False)
    near = Timing(1, 16, 1, tuple(s * 1.02 for s in steady), (0.51,), (0.0,))
    assert needs_more([fast, near]) == []
    tied = decide([fast, near])
    assert tied is not None and tied.tie and tied.winner == 0
    waited = Timing(1, 16, 1, tuple(s * 3 for s in steady), (1.5,), (0.86,))
    assert needs_more([fast, waited]) == [1]
    assert needs_more([Timing(0, 16, 1, steady, (0.5,)), slow]) == [0]  # not measured (CUDA): as before


def test_a_busy_machine_decides_nothing_and_the_users_order_wins() -> None:
    """The root tune beside a busy core: recomputation at micro-batch 32 won two runs of five at 13.5-13.9
    samples/s, no recomputation at 16 the others at 7.8-14.2 (a quiet machine: 140-156). Rates measured
    while every probe waited for a core tie with everyone; the first in the user's order wins, and the
    decision says the machine was busy. Once one contender was timed quietly, the busy ones are timed
    again."""
    steps = (1.2, 1.3, 1.25, 1.4)
    first = Timing(0, 16, 1, steps, (1.65, 1.6), (0.9, 0.85))  # 9.7 samples/s
    rc = Timing(1, 32, 1, steps, (2.37, 2.3), (0.88, 0.9))  # 13.5 samples/s
    assert first.busy and rc.busy and rc.rate > first.rate
    assert needs_more([first, rc]) == []
    decision = decide([first, rc])
    assert decision is not None and (decision.winner, decision.tie, decision.busy) == (0, True, True)
    quiet_rc = Timing(1, 32, 1, (0.2, 0.21), (0.2, 0.205), (0.01, 0.0))
    assert needs_more([first, quiet_rc]) == [0]
    mixed = Timing(0, 16, 1, steps, (1.65, 0.11), (0.9, 0.02))  # one of its probes ran quietly
    assert not mixed.busy


def test_quiet_means_threads_that_waited_less_than_a_tenth_of_the_time() -> None:
    assert quiet(0.0) and quiet(0.05)
    assert not quiet(QUIET_WAIT) and not quiet(0.86) and not quiet(None)


def test_inside_the_equivalence_band_by_less_than_the_noise_is_timed_again() -> None:
    """The root tune on a quiet machine: sgd measured 4.9 % faster than adamw in one run of five (6.5-10.5 %
    in the others), inside the 5 % band by less than its noise, and the tie went to adamw. Both are timed
    again; deep inside the band, no one is."""
    steady = tuple(0.1 * (1 + 0.004 * (i % 3)) for i in range(9))
    adamw = Timing(0, 16, 1, steady, (0.1,), (0.0,))
    sgd = Timing(1, 16, 1, tuple(s / 1.051 for s in steady), (0.1 / 1.051,), (0.0,))  # 4.85 % apart
    assert needs_more([adamw, sgd]) == [0, 1]
    close = Timing(1, 16, 1, tuple(s / 1.01 for s in steady), (0.1 / 1.01,), (0.0,))
    assert needs_more([adamw, close]) == []
