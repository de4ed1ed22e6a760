"""The guard's policy (autobatch.core.ladder): the rungs, lowering, growing back, backing off for good."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autobatch.core.ladder import Ladder, LadderSettings, Move, after_step, lower, rungs


def test_rungs_are_the_fitted_sizes_the_maximum_and_halvings_down_to_one() -> None:
    assert rungs([12, 14, 16, 40], 16) == (1, 3, 6, 12, 14, 16)
    assert rungs([], 5) == (1, 2, 5)
    assert rungs([1, 3], 3) == (1, 3)
    assert rungs([], 1) == (1,)


def test_rungs_refuse_a_maximum_below_one() -> None:
    with pytest.raises(ValueError, match="maximum"):
        rungs([4], 0)


@given(st.lists(st.integers(-3, 300)), st.integers(1, 300))
def test_rungs_always_reach_one_and_the_maximum(fitted: list[int], maximum: int) -> None:
    sizes = rungs(fitted, maximum)
    assert sizes[0] == 1 and sizes[-1] == maximum
    assert list(sizes) == sorted(set(sizes))


def test_lower_goes_to_the_next_rung_not_half() -> None:
    ladder = Ladder.start((1, 2, 4, 7, 8), 8)
    lowered = lower(ladder)
    assert lowered is not None
    ladder, move = lowered
    assert move == Move(8, 7, "out of memory")
    assert ladder.size == 7 and ladder.failures_at(8) == 1 and ladder.ceiling == 8


def test_lower_at_the_smallest_rung_has_nowhere_to_go() -> None:
    assert lower(Ladder.start((1, 2), 1)) is None


def test_grows_back_one_rung_after_grow_after_clean_steps() -> None:
    ladder = Ladder.start((1, 2, 4, 8), 4, LadderSettings(grow_after=3))
    ladder = Ladder(ladder.sizes, 4, 8, ladder.settings)
    moves = []
    for _ in range(7):
        ladder, move = after_step(ladder)
        moves.append(move)
    assert moves == [None, None, Move(4, 8, "grow"), None, None, None, None]
    assert ladder.size == 8  # the top: no further growth


def test_a_size_that_fails_twice_is_never_tried_again() -> None:
    ladder = Ladder.start((1, 2, 4, 8), 8, LadderSettings(grow_after=2, max_failures=2))
    lowered = lower(ladder)
    assert lowered is not None
    ladder = lowered[0]
    ladder, _ = after_step(ladder)
    ladder, move = after_step(ladder)
    assert move == Move(4, 8, "grow")  # one failure: it tries again
    lowered = lower(ladder)
    assert lowered is not None
    ladder = lowered[0]
    assert ladder.ceiling == 4
    for _ in range(10):
        ladder, move = after_step(ladder)
        assert move is None
    assert ladder.size == 4


def test_allocator_retries_block_growth_and_lower_after_the_limit() -> None:
    ladder = Ladder((1, 2, 4, 8), 4, 8, LadderSettings(grow_after=2, retry_limit=2))
    ladder, move = after_step(ladder)  # one clean step
    assert move is None
    ladder, move = after_step(ladder, retries=True)  # not clean: the count starts again
    assert move is None and ladder.clean == 0 and ladder.retried == 1
    ladder, move = after_step(ladder, retries=True)
    assert move == Move(4, 2, "allocator retries")
    assert ladder.failures_at(4) == 1


def test_a_clean_step_ends_a_run_of_retries() -> None:
    ladder = Ladder((1, 2, 4), 4, 4, LadderSettings(retry_limit=2))
    ladder, _ = after_step(ladder, retries=True)
    ladder, _ = after_step(ladder)
    ladder, move = after_step(ladder, retries=True)
    assert move is None and ladder.size == 4


def test_settings_reject_zero() -> None:
    with pytest.raises(ValueError, match="grow_after"):
        LadderSettings(grow_after=0)


@given(st.lists(st.sampled_from(["oom", "clean", "retry"]), max_size=200))
def test_the_size_stays_on_the_rungs_and_under_the_ceiling(outcomes: list[str]) -> None:
    ladder = Ladder.start(rungs([5, 9, 12], 12), 12, LadderSettings(grow_after=3))
    for outcome in outcomes:
        if outcome == "oom":
            lowered = lower(ladder)
            if lowered is None:
                assert ladder.lowest
                continue
            ladder = lowered[0]
        else:
            ladder, _ = after_step(ladder, retries=outcome == "retry")
        assert ladder.size in ladder.sizes and ladder.size <= ladder.ceiling
        assert all(
            ladder.failures_at(s) < ladder.settings.max_failures for s in ladder.sizes if s <= ladder.ceiling
        )
