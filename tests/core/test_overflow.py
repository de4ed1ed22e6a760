"""The batches of a data set that would run out of memory (autobatch.core.overflow): pure numbers, small
enough to check by hand, and brute force against the closed forms."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.lengths import Surface
from autobatch.core.overflow import (
    Measured,
    Memory,
    by_tokens,
    critical_length,
    longest_under_tokens,
    overflow,
    padded,
    percentile,
    shuffled_share,
    spread,
    token_batches,
)

# peak(B, L) = 100 + B·L bytes against a line of 200: B sequences fit up to 100 // B tokens
LINEAR = Surface(100.0, 1.0, 0.0, (10, 20))
LINE = 200
MEMORY = Memory(LINEAR, LINE)
DATA = [10, 20, 60, 30, 40, 50, 51, 200]


def test_padding_by_hand() -> None:
    # batches of 2: [10 20] [60 30] [40 50] [51 200]; two sequences fit up to 50 tokens (100 + 2·50 = 200)
    found = padded(DATA, MEMORY, 2)
    assert (found.batches, found.overflowing, found.first_overflowing_batch) == (4, 2, 1)
    assert found.longest_length == 50 and found.long_sequences == 3  # 60, 51 and 200
    assert found.share == 0.5
    # shuffled: 5 of the 8 sequences are at or under 50; a batch of 2 holds only those with C(5,2)/C(8,2)
    assert found.shuffled_share == pytest.approx(1 - 10 / 28)


def test_the_last_smaller_batch_has_its_own_critical_length() -> None:
    # batches of 3: [10 20 60] over (3 fit up to 33), [30 40 50] over, [51 200]: 2 fit up to 50: over
    assert padded(DATA, MEMORY, 3).overflowing == 3
    # [60] alone fits (one sequence fits up to 100 tokens); [200] alone does not
    assert padded([60], MEMORY, 4).overflowing == 0
    assert padded([200], MEMORY, 4).overflowing == 1


def test_data_smaller_than_one_batch_is_one_batch_shuffled_or_not() -> None:
    # 3 sequences at a batch of 4: one batch of 3, which fits up to 33 tokens (4 would fit up to 25)
    fits, over = padded([10, 30, 20], MEMORY, 4), padded([10, 40, 20], MEMORY, 4)
    assert (fits.overflowing, fits.share, fits.shuffled_share) == (0, 0.0, 0.0)
    assert (over.overflowing, over.share, over.shuffled_share) == (1, 1.0, 1.0)
    assert fits.longest_length == 25 and fits.long_sequences == 1  # the full batch's figures, as before


@given(st.lists(st.integers(1, 120), min_size=1, max_size=12), st.integers(1, 12))
def test_the_shuffled_share_of_a_single_batch_is_the_file_orders(lengths: list[int], batch: int) -> None:
    found = padded(lengths, MEMORY, max(batch, len(lengths)))
    assert found.batches == 1 and found.shuffled_share == found.share


def test_token_batches_by_hand() -> None:
    # a budget of 150 tokens: 60 and 30 pad to 2·60 = 120; 40 would make 3·60 = 180, and starts a batch
    assert list(token_batches(DATA, 150)) == [(2, 20), (2, 60), (2, 50), (1, 51), (1, 200)]
    found = by_tokens(DATA, MEMORY, 150)
    # (2, 60) peaks at 100 + 120 = 220 > 200; 200 tokens cannot be batched within 150
    assert (found.batches, found.overflowing, found.unbatchable) == (5, 2, 1)
    assert found.first_overflowing_batch == 1 and found.share == pytest.approx(2 / 5)
    # a full budget: 150 sequences of 1 token peak at 250; one sequence of L in (75, 100] fits, but the lengths
    # before it do not: the budget survives no length up to it
    assert found.longest_length == 0
    assert by_tokens(DATA, MEMORY, 100).longest_length == 100  # every full batch holds 100 tokens at most


def test_a_sequence_longer_than_the_budget_ends_the_batch_before_it() -> None:
    assert list(token_batches([5, 5, 500, 5], 100)) == [(2, 5), (1, 500), (1, 5)]
    assert list(token_batches([], 100)) == []


def test_the_distribution_uses_nearest_ranks() -> None:
    found = spread(list(range(1, 101)))
    assert (found.count, found.min, found.p50, found.p90, found.p99, found.max) == (100, 1, 50, 90, 99, 100)
    assert found.mean == 50.5
    assert percentile([7], 0.99) == 7 and percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == 9


def test_a_quadratic_surface_by_hand() -> None:
    # peak = 0 + 1·B·L + 1·B·L² against 2·(10 + 100) = 220: two sequences fit up to 10 tokens
    surface = Surface(0.0, 1.0, 1.0, (8, 16))
    assert critical_length(surface, 2, 220) == 10 and critical_length(surface, 2, 219) == 9
    assert critical_length(surface, 1, 0) == 0


def test_a_surface_that_does_not_grow_is_refused() -> None:
    with pytest.raises(ValueError, match="grow"):
        critical_length(Surface(100.0, 0.0, 0.0, (8, 16)), 2, 200)


def test_both_schemes_or_one() -> None:
    both = overflow(DATA, MEMORY, batch_size=2, max_tokens=150)
    assert both.padded is not None and both.tokens is not None and both.overflows
    only = overflow(DATA[:2], MEMORY, batch_size=2, max_tokens=None)
    assert only.tokens is None and not only.overflows


surfaces = st.builds(
    Surface,
    st.floats(0, 1e5),
    st.floats(20, 1e3),
    st.sampled_from([0.0, 1e-3, 0.25, 3.0]),
    st.just((64, 128)),
)


@settings(max_examples=200, deadline=None)
@given(surfaces, st.integers(1, 64), st.floats(1e4, 1e6))
def test_the_critical_length_is_the_brute_force_one(surface: Surface, batch: int, line: float) -> None:
    brute = 0
    while surface.peak(batch, brute + 1) <= line:
        brute += 1
    if surface.peak(batch, 0) > line:
        brute = 0
    assert critical_length(surface, batch, line) == brute


@settings(max_examples=150, deadline=None)
@given(surfaces, st.integers(1, 400), st.floats(1e5, 1e7))
def test_the_length_a_budget_survives_up_to_is_the_brute_force_one(
    surface: Surface, budget: int, line: float
) -> None:
    fails = [n for n in range(1, budget + 1) if surface.peak(budget // n, n) > line]
    assert longest_under_tokens(Memory(surface, line), budget) == (fails[0] - 1 if fails else budget)


def test_a_budget_survives_up_to_the_first_length_that_fails() -> None:
    """The saw-tooth of a full batch: a budget of 14,080 tokens on a real tune's surface (32-true/adamw, eager
    attention, under 512 MiB on the CPU device) fails at 265 tokens (53 sequences) and fits at 272 (51): it said
    "survives up to 272 tokens a sequence"."""
    surface = Surface(317_042_005.0, 7571.299, 15.242923, (64, 128, 256))
    line, budget = 480_038_092, 14_080
    assert surface.peak(53, 265) > line and surface.peak(51, 272) <= line
    assert longest_under_tokens(Memory(surface, line), budget) == 264


def test_the_measured_peaks_and_maxima_decide_at_the_searched_lengths() -> None:
    """The same tune: at 256 tokens batch 55 fitted at 480,002,048 bytes (36 KB under the line) and batch 56 ran
    out of memory. The surface passes 1.4 MB under that peak and read batch 55 as fitting at 257 tokens, 0.8 MB
    more; raised to the peak, it stops at 256. At 64 tokens the surface is over the peak of the maximum, 299,
    and read it as not fitting there: the measurement keeps it."""
    surface = Surface(317_042_005.0, 7571.299, 15.242923, (64, 128, 256))
    line = 480_038_092
    measured = (
        Measured(64, 299, 479_526_912, 300),
        Measured(128, 133, 479_010_816, 134),
        Measured(256, 55, 480_002_048, 56),
    )
    assert critical_length(surface, 55, line) == 257 and critical_length(surface, 299, line) < 64
    memory = Memory.of(surface, line, measured)
    assert memory.raised_bytes == pytest.approx(1_413_342, abs=1)
    assert memory.critical_length(55) == 256 and memory.critical_length(299) == 64
    assert memory.critical_length(56) < 256 and memory.critical_length(300) < 64  # the batches that ran out
    assert Memory.of(surface, line).critical_length(55) == 257  # without the measurements: the fit alone


def test_the_largest_batch_at_a_length_is_read_as_the_critical_length_reads_it() -> None:
    """The same tune's figures: the table's prediction at a length is the batch that ``autobatch lengths`` says
    survives it, from the raised surface and within the measurements."""
    surface = Surface(317_042_005.0, 7571.299, 15.242923, (64, 128, 256))
    line = 480_038_092
    measured = (Measured(64, 299, 479_526_912, 300), Measured(256, 55, 480_002_048, 56))
    memory = Memory.of(surface, line, measured)
    assert memory.max_batch(256) == 55 and memory.max_batch(64) == 299  # the probes decide where they ran
    assert surface.max_batch(64, line) < 299  # the surface alone says less
    assert memory.max_batch(128) <= surface.max_batch(128, line)  # raised: never more than the fit


@settings(max_examples=150, deadline=None)
@given(
    surfaces,
    st.floats(1e4, 2e5),
    st.lists(st.tuples(st.integers(1, 300), st.integers(0, 80), st.integers(1, 90)), max_size=3),
    st.integers(16, 300),
    st.sampled_from([1, 2, 8]),
)
def test_the_largest_batch_is_the_brute_force_one(
    surface: Surface, line: float, runs: list[tuple[int, int, int]], seq_len: int, multiple: int
) -> None:
    measured = [
        Measured(n, fits, surface.peak(fits, n) * 1.01 if fits else None, fits + extra)
        for n, fits, extra in runs
    ]
    memory = Memory.of(surface, line, measured)
    fitting = [
        b for b in range(multiple, 1000, multiple) if memory.critical_length(b) >= seq_len
    ]  # under 625
    expected = max(fitting, default=0)
    assert memory.max_batch(seq_len, multiple) == expected


@given(st.integers(1, 60), st.data())
def test_the_shuffled_share_is_the_exact_ratio_of_combinations(total: int, data: st.DataObject) -> None:
    short = data.draw(st.integers(0, total))
    batch = data.draw(st.integers(1, total))
    exact = 1 - Fraction(comb(short, batch), comb(total, batch))
    assert shuffled_share(total, short, batch) == pytest.approx(float(exact), abs=1e-12)


def test_a_tiny_shuffled_share_is_not_lost_to_rounding() -> None:
    # one long sequence in a million, batches of 8: 8 in a million batches hold it
    assert shuffled_share(1_000_000, 999_999, 8) == pytest.approx(8e-6, rel=1e-9)
    assert shuffled_share(10, 3, 4) == 1.0 and shuffled_share(10, 10, 4) == 0.0


@given(st.lists(st.integers(0, 300), max_size=60), st.integers(1, 400))
def test_token_batches_keep_the_order_and_the_budget(lengths: list[int], budget: int) -> None:
    batches = list(token_batches(lengths, budget))
    assert sum(count for count, _ in batches) == len(lengths)
    start = 0
    for count, longest in batches:
        chunk = lengths[start : start + count]
        assert max(chunk) == longest
        assert count * longest <= budget or (count == 1 and longest > budget)
        start += count
    for (count, longest), (_, following) in zip(batches, batches[1:]):  # greedy: the next did not fit
        assert (count + 1) * max(longest, following) > budget or following > budget or longest > budget
