"""Accumulation plans, the knee of the throughput curve, and the choice among combinations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.plan import (
    Candidate,
    Plan,
    choose,
    knee,
    plan_accumulation,
    plan_with_script_accumulation,
)
from autobatch.errors import UsageError


def test_no_global_batch_uses_the_maximum() -> None:
    assert plan_accumulation(48, None, world_size=4) == Plan(48, 1, 4, 192, None, True, None)


@pytest.mark.parametrize(
    ("max_micro", "global_batch", "world", "multiple", "expected"),
    [
        (64, 256, 1, 1, (64, 4)),
        (300, 256, 1, 1, (256, 1)),  # the maximum exceeds the global batch: no accumulation
        (100, 256, 1, 1, (64, 4)),  # 256 = 64 x 4 is the fewest steps with micro <= 100
        (60, 256, 2, 1, (32, 4)),
        (48, 256, 1, 8, (32, 8)),  # 48 does not divide 256; 32 is a multiple of 8
        (100, 1001, 1, 1, (91, 11)),  # 7 x 11 x 13
    ],
)
def test_exact_splits_take_the_fewest_steps(
    max_micro: int, global_batch: int, world: int, multiple: int, expected: tuple[int, int]
) -> None:
    plan = plan_accumulation(max_micro, global_batch, world, multiple)
    assert (plan.micro_batch_size, plan.accumulation_steps) == expected
    assert plan.exact and plan.global_batch_size == global_batch == plan.requested_global_batch_size
    assert plan.note is None


def test_indivisible_world_size_gets_the_closest_split_and_a_learning_rate_note() -> None:
    plan = plan_accumulation(64, 256, world_size=3)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.world_size) == (17, 5, 3)
    assert plan.global_batch_size == 255 and not plan.exact
    assert plan.note == (
        "256 is not divisible by world size 3; effective global batch 255 differs from requested 256 (-0.4%); "
        "scale the learning rate by 255/256 (linear rule) or by sqrt(255/256) for Adam-type optimizers"
    )


def test_closest_split_prefers_few_steps_then_not_exceeding() -> None:
    # 100 / 3: 33 x 3 = 99 and 34 x 3 = 102 both need one step; 99 is closer.
    plan = plan_accumulation(64, 100, world_size=3)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (33, 1, 99)
    # 10 / 4: 2 x 4 = 8 and 3 x 4 = 12 deviate equally, both in one step: not above the request wins.
    plan = plan_accumulation(64, 10, world_size=4)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (2, 1, 8)
    assert plan.note is not None and "-20.0%" in plan.note


def test_global_batch_below_world_size() -> None:
    plan = plan_accumulation(64, 2, world_size=4)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (1, 1, 4)
    assert plan.note is not None and "smaller than world size 4" in plan.note and "+100.0%" in plan.note


def test_exact_split_off_the_multiple_says_so() -> None:
    plan = plan_accumulation(7, 256, batch_multiple=8)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.exact) == (4, 64, True)
    assert plan.note is not None and "not a multiple of 8" in plan.note


def test_awkward_exact_split_offers_a_closer_alternative() -> None:
    plan = plan_accumulation(100, 1009)  # prime: only 1 x 1009 is exact
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.exact) == (1, 1009, True)
    assert plan.note is not None and "92 x 11 steps x 1 device(s) = 1012 (+0.3%)" in plan.note


@pytest.mark.parametrize("args", [(0, 256), (64, 0), (64, 256, 0), (64, 256, 1, 0), (64, -3)])
def test_plan_rejects_nonsense(args: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        plan_accumulation(*args)


def _splits(max_micro: int, global_batch: int, world: int) -> list[tuple[int, int]]:
    return [
        (m, s)
        for m in range(1, max_micro + 1)
        for s in range(1, global_batch + 2)
        if m * world * s <= 2 * global_batch + world
    ]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 64), st.integers(1, 300), st.integers(1, 8), st.sampled_from((1, 2, 8)))
def test_plan_is_optimal_by_brute_force(max_micro: int, global_batch: int, world: int, multiple: int) -> None:
    plan = plan_accumulation(max_micro, global_batch, world, multiple)
    m, s = plan.micro_batch_size, plan.accumulation_steps
    assert 1 <= m <= max_micro and s >= 1 and plan.world_size == world
    assert plan.global_batch_size == m * s * world
    assert plan.exact == (global_batch % world == 0) == (plan.global_batch_size == global_batch)
    splits = _splits(max_micro, global_batch, world)
    best_deviation = min(abs(a * world * b - global_batch) for a, b in splits)
    assert abs(plan.global_batch_size - global_batch) == best_deviation
    closest = [(a, b) for a, b in splits if abs(a * world * b - global_batch) == best_deviation]
    on_multiple = [(a, b) for a, b in closest if a % multiple == 0]
    pool = on_multiple or closest
    assert (m % multiple == 0) == bool(on_multiple)
    assert s == min(b for _, b in pool)  # fewest steps among the closest splits
    if plan.exact:
        assert plan.note is None or "not a multiple" in plan.note or "exact split needs" in plan.note
    else:
        assert plan.note is not None and f"{plan.global_batch_size}/{global_batch}" in plan.note
        below = [(a, b) for a, b in pool if b == s and a * world * b < global_batch]
        assert plan.global_batch_size < global_batch or not below  # not above the request on ties


def test_knee() -> None:
    points = [(8, 100.0), (16, 180.0), (32, 290.0), (64, 300.0), (128, 305.0)]
    assert knee(points) == 32  # 290 >= 0.95 * 305
    assert knee(points, tolerance=0.0) == 128
    assert knee(points, tolerance=0.5) == 16
    assert knee([]) is None
    with pytest.raises(ValueError):
        knee(points, tolerance=1.0)


def cand(index: int, max_batch: int | None, sps: float | None = None, world: int = 1) -> Candidate:
    plan = plan_accumulation(max_batch, 256, world) if max_batch else None
    return Candidate(index, max_batch, sps, plan)


def test_choose_max_batch_breaks_ties_by_order() -> None:
    candidates = [cand(0, 64, 900.0), cand(1, 128, 100.0), cand(2, 128, 500.0), cand(3, None)]
    assert choose(candidates, "max-batch") == 1


def test_choose_throughput() -> None:
    candidates = [cand(0, 64, 900.0), cand(1, 128, 100.0), cand(2, 128, 950.0)]
    assert choose(candidates, "throughput") == 2
    tied = [cand(0, 64, 900.0), cand(1, 128, 900.0)]
    assert choose(tied, "throughput") == 0


def test_choose_throughput_falls_back_to_max_batch() -> None:
    assert choose([cand(0, 64), cand(1, 128), cand(2, 128)], "throughput") == 1
    # a measured candidate ranks ahead of unmeasured ones
    assert choose([cand(0, 64), cand(1, 32, 10.0)], "throughput") == 1


def test_infeasible_never_wins() -> None:
    assert choose([cand(0, None, 1e9), cand(1, 1, 1.0)], "throughput") == 1
    assert choose([cand(0, None), cand(1, None)], "max-batch") is None
    assert choose([], "throughput") is None
    with pytest.raises(ValueError):
        choose([cand(0, 4)], "fastest")


def test_a_script_that_accumulates_itself_is_given_micro_batches_that_reach_the_global_batch() -> None:
    plan = plan_with_script_accumulation(3000, 2048, 1, 1, own=4, settable=False)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size, plan.exact) == (
        512,
        4,
        2048,
        True,
    )
    # through {accum}: the plan gives the script 2, which accumulates 4 of its own each
    plan = plan_with_script_accumulation(256, 2048, 1, 1, own=4, settable=True)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (256, 8, 2048)
    # no global batch asked: the maximum, and what the script makes of it
    plan = plan_with_script_accumulation(300, None, 2, 1, own=4, settable=False)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (300, 4, 2400)


@pytest.mark.parametrize(
    ("max_micro", "global_batch", "settable", "words"),
    [
        (256, 2048, False, "needs micro-batch 512, above the maximum 256"),
        (3000, 2050, False, "is not a multiple of 4 x 1 = 4"),
        (3000, 2050, True, "is not a multiple of 4 x 1 = 4"),
    ],
)
def test_a_global_batch_its_own_accumulation_cannot_reach_is_refused(
    max_micro: int, global_batch: int, settable: bool, words: str
) -> None:
    with pytest.raises(UsageError) as caught:
        plan_with_script_accumulation(max_micro, global_batch, 1, 1, own=4, settable=settable)
    assert (
        words in caught.value.message
        and f"global batch {global_batch} = micro-batch x 4" in caught.value.message
    )
    assert ("{accum}" in (caught.value.hint or "")) is not settable
