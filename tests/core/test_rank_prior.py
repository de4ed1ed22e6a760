"""A strategy's prior from the single-process curve (pure): fake numbers, fake probes, no torch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.maximum import SCOUT_CANDIDATES, Limits, StaticMemory, find_maximum
from autobatch.core.model import Affine
from autobatch.core.rank_prior import (
    RankState,
    basis,
    curve_of,
    fit_line,
    per_rank,
    rank_line,
    strategy_prior,
)
from autobatch.core.search import Observation
from autobatch.testing import FakeStepProbe, affine, true_max

MiB = 2**20
LIMITS = Limits(max_batch_size=65536, batch_multiple=1, steps=3, max_steps=3, confirm_steps=4)
# 16 M parameters in fp32 with AdamW: 64 MiB parameters, 64 MiB gradients, 128 MiB optimizer state;
# 32 blocks of 2 MiB and 0 MiB outside them.
STATE = RankState(64 * MiB, 64 * MiB, 128 * MiB, largest_block=2 * MiB, unblocked=0)
SINGLE = Affine(400 * MiB, 0.07 * MiB)


def test_fsdp_divides_the_sharded_state_and_adds_one_gathered_block() -> None:
    line = rank_line(SINGLE, "fsdp", 2, STATE)
    assert line.slope == SINGLE.slope  # each rank runs its own micro-batch through the whole model
    assert line.intercept == 400 * MiB - 256 * MiB / 2 + 2 * 2 * MiB
    four = rank_line(SINGLE, "fsdp", 4, STATE)
    assert four.intercept == 400 * MiB - 256 * MiB * 3 / 4 + 2 * 2 * MiB


def test_fsdp_keeps_the_roots_own_parameters_gathered() -> None:
    root = RankState(64 * MiB, 64 * MiB, 128 * MiB, largest_block=0, unblocked=64 * MiB)
    line = rank_line(SINGLE, "fsdp", 2, root)
    assert line.intercept == 400 * MiB - 256 * MiB / 2 + 64 * MiB / 2


def test_ddp_adds_the_gradient_buckets_and_the_runtime() -> None:
    line = rank_line(SINGLE, "ddp", 2, STATE, runtime_bytes=30 * MiB)
    assert line == Affine(400 * MiB + 64 * MiB + 30 * MiB, SINGLE.slope)
    assert rank_line(SINGLE, "ddp", 8, STATE) == rank_line(SINGLE, "ddp", 2, STATE)  # not sharded


def test_no_prior_without_a_curve_or_a_strategy() -> None:
    assert strategy_prior(None, "fsdp", 2, STATE) is None
    assert strategy_prior(SINGLE, "none", 2, STATE) is None
    assert strategy_prior(SINGLE, "fsdp", 1, STATE) is None
    with pytest.raises(ValueError):
        rank_line(SINGLE, "none", 2, STATE)


def test_the_prior_says_where_it_came_from() -> None:
    prior = strategy_prior(SINGLE, "fsdp", 2, STATE)
    assert prior is not None and prior.slope_known
    assert prior.basis == basis("fsdp", 2) == "prior from the single-process curve, sharded state / 2"
    assert "gradient buckets" in basis("ddp", 2)


def test_fit_line_needs_two_batches_and_a_rising_curve() -> None:
    assert fit_line([(10, 100)]) is None
    assert fit_line([(10, 100), (10, 120)]) is None
    assert fit_line([(10, 100), (20, 100)]) is None  # a plateau has no per-sample cost
    line = fit_line([(10, 110), (20, 120), (40, 140)])
    assert line is not None
    assert line.intercept == pytest.approx(100) and line.slope == pytest.approx(1)


def test_curve_reads_the_rising_phase_below_the_smallest_miss() -> None:
    observations = [
        # the optimizer step's plateau (400) hides the slope; the rising phase shows it
        Observation(100, True, peak_bytes=400, rising_bytes=200),
        Observation(200, True, peak_bytes=400, rising_bytes=300),
        Observation(300, True, peak_bytes=410, rising_bytes=400),
        Observation(400, False, kind="oom"),
        Observation(500, True, peak_bytes=450, rising_bytes=999),  # above a miss: a flicker, ignored
    ]
    line = curve_of(observations)
    assert line is not None
    assert line.intercept == pytest.approx(100) and line.slope == pytest.approx(1)
    # one fit without the rising phase: the total peaks, which here are a plateau: no line
    assert curve_of([*observations[:2], Observation(300, True, peak_bytes=400)]) is None


def single_process_probes(curve: FakeStepProbe) -> list[Observation]:
    """What a single-process tune journals: its whole search."""
    find_maximum(curve, budget_bytes=curve.budget_bytes, limits=LIMITS)
    return [curve(b, LIMITS.search_steps, "search") for b, _, _ in list(curve.calls)]


def test_first_probe_of_the_strategy_tune_lands_at_the_boundary() -> None:
    """An FSDP rank's true curve is the single-process one less half the sharded state (plus a gathered
    block): with the single-process curve known, the strategy search starts at its boundary and takes
    two probes (the predicted maximum, run as long as a confirmation, and its neighbour)."""
    budget = 540 * MiB
    single = affine(400 * MiB, 0.07 * MiB)
    observations = single_process_probes(FakeStepProbe(single, budget))
    rank = affine(400 * MiB - 128 * MiB + 4 * MiB, 0.07 * MiB)
    expected = true_max(rank, budget, LIMITS.max_batch_size)
    prior = strategy_prior(curve_of(observations), "fsdp", 2, STATE)
    with_prior = FakeStepProbe(rank, budget)
    answer = find_maximum(with_prior, budget_bytes=budget, limits=LIMITS, prediction=prior)
    assert answer.max_batch_size == expected and answer.status == "exact"
    first = with_prior.calls[0][0]
    assert abs(first - expected) <= 1
    assert answer.probes <= 3
    without = FakeStepProbe(rank, budget)
    baseline = find_maximum(without, budget_bytes=budget, limits=LIMITS)
    assert baseline.max_batch_size == expected
    assert without.calls[0][0] == SCOUT_CANDIDATES and answer.probes < baseline.probes


@settings(max_examples=60, deadline=None)
@given(
    off=st.integers(min_value=-150, max_value=150),  # how wrong the predicted intercept is (MiB)
    slope_kib=st.integers(min_value=8, max_value=4096),
)
def test_a_wrong_prior_costs_probes_never_the_answer(off: int, slope_kib: int) -> None:
    budget = 540 * MiB
    rank = affine(300 * MiB, slope_kib * 1024)
    prior = strategy_prior(Affine(300 * MiB + off * MiB + 128 * MiB, slope_kib * 1024), "fsdp", 2, STATE)
    probe = FakeStepProbe(rank, budget)
    answer = find_maximum(probe, budget_bytes=budget, limits=LIMITS, prediction=prior)
    assert answer.max_batch_size == true_max(rank, budget, LIMITS.max_batch_size)
    assert answer.status in ("exact", "capped")


def test_one_fsdp_rank_holds_a_share_of_the_static_memory() -> None:
    static = StaticMemory(64 * MiB, 64 * MiB, 128 * MiB)
    assert per_rank(static, "fsdp", 4) == StaticMemory(16 * MiB, 16 * MiB, 32 * MiB)
    assert per_rank(static, "ddp", 4) == static == per_rank(static, "none", 1)
