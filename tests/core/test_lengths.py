"""The memory surface over batch size and sequence length (autobatch.core.lengths): pure numbers."""

from __future__ import annotations

import pytest

from autobatch.core.lengths import (
    Line,
    Surface,
    between,
    fit,
    fit_error,
    prior_line,
    search_order,
    token_budget,
    unmoved,
)

MiB = 1 << 20
A, B, C = 300 * MiB, 20_000.0, 30.0  # static bytes, bytes per token, bytes per token pair


def line(seq_len: int, c: float = C) -> Line:
    return Line(seq_len, A, B * seq_len + c * seq_len * seq_len)


def test_two_lengths_separate_the_linear_and_the_quadratic_terms() -> None:
    surface = fit([line(128), line(512)])
    assert surface is not None
    assert surface.per_token == pytest.approx(B) and surface.per_token_squared == pytest.approx(C)
    assert surface.intercept == A and surface.lengths == (128, 512)
    assert surface.slope(256) == pytest.approx(B * 256 + C * 256 * 256)


def test_an_attention_that_keeps_no_scores_fits_no_quadratic_term() -> None:
    surface = fit([line(128, c=0.0), line(256, c=0.0), line(512, c=0.0)])
    assert surface is not None and surface.per_token_squared == pytest.approx(0.0, abs=1e-9)
    assert surface.attention_share(512) == pytest.approx(0.0, abs=1e-9)
    assert fit([line(128), line(512)]).attention_share(512) == pytest.approx(  # type: ignore[union-attr]
        C * 512 / (B + C * 512)
    )


def test_noise_that_would_make_the_quadratic_term_negative_holds_it_at_zero() -> None:
    lines = [Line(128, A, 2_000_000.0), Line(256, A, 3_900_000.0), Line(512, A, 7_700_000.0)]
    surface = fit(lines)
    assert surface is not None and surface.per_token_squared == 0.0 and surface.per_token > 0


def test_one_length_scales_linearly_and_says_its_slope_is_not_known() -> None:
    surface = fit([line(512)])
    assert surface is not None and surface.per_token_squared == 0.0
    intercept, slope, known = prior_line([line(512)], 256)  # type: ignore[misc]
    assert (intercept, known) == (A, False)
    assert slope == pytest.approx(line(512).slope / 2)  # too steep for a shorter length: a safe first probe
    assert slope > line(256).slope
    assert prior_line([line(512), line(128)], 256)[2] is True  # type: ignore[index]
    assert prior_line([], 256) is None


def test_the_maximum_and_the_longest_length_invert_each_other() -> None:
    surface = Surface(A, B, C, (128, 512))
    budget = 1024 * MiB
    for seq_len in (64, 128, 384, 512, 1000):
        best = surface.max_batch(seq_len, budget)
        assert surface.peak(best, seq_len) <= budget < surface.peak(best + 1, seq_len)
        assert surface.max_batch(seq_len, budget, multiple=8) == best // 8 * 8
        longest = surface.longest(best, budget)
        assert surface.peak(best, longest) <= budget < surface.peak(best, longest + 1)
        assert longest >= seq_len
    assert surface.longest(1, A - 1) == 0 and surface.max_batch(512, A) == 0
    linear = Surface(A, B, 0.0, (128,))
    assert linear.longest(10, A + 10 * B * 100) == 100


def test_the_token_budget_is_the_least_tokens_that_fit_at_every_length() -> None:
    assert token_budget({128: 400, 256: 185, 512: 70}) == 70 * 512
    assert token_budget({128: 400, 256: 10}) == 2560
    assert token_budget({}) is None


def test_the_fit_error_is_measured_against_the_measured_maxima() -> None:
    surface = Surface(A, B, C, (128, 512))
    budget = 1024 * MiB
    exact = {n: surface.max_batch(n, budget) for n in (128, 256, 512)}
    assert fit_error(surface, exact, budget) == 0.0
    off = {**exact, 256: int(exact[256] * 1.1)}
    assert fit_error(surface, off, budget) == pytest.approx(abs(exact[256] - off[256]) / off[256])
    assert fit_error(surface, {512: exact[512]}, budget) is None


def test_predicted_lengths_are_the_powers_of_two_between_the_searched_ones() -> None:
    assert between([128, 256, 512]) == []
    assert between([128, 2048]) == [256, 512, 1024]
    assert between([100, 1000]) == [128, 256, 512]
    assert between([512]) == []


def test_the_plans_length_first_then_the_farthest_then_those_between() -> None:
    assert search_order([128, 256, 512], 512) == [512, 128, 256]
    assert search_order([128, 256, 512, 1024], 512) == [512, 1024, 256, 128]
    assert search_order([256], 256) == [256]
    assert search_order([128, 512], 512) == [512, 128]


@pytest.mark.parametrize(
    ("slopes", "flagged"),
    [
        ({256: 1.0, 512: 1.0}, True),  # the same batches at both lengths
        ({256: 1.0, 512: 1.09}, True),  # under a tenth of the length's growth
        ({256: 1.0, 512: 1.11}, False),  # a per-sample part that does not move, and one that does
        ({64: 1.0, 128: 2.0, 256: 4.0}, False),  # memory per token
        ({512: 1.0}, False),  # one length tells nothing
    ],
)
def test_memory_per_sample_that_does_not_move_with_the_length(
    slopes: dict[int, float], flagged: bool
) -> None:
    lines = [Line(n, A, slope * MiB) for n, slope in slopes.items()]
    found = unmoved(reversed(lines))
    assert (found is not None) == flagged
    if found is not None:
        assert (found[0].seq_len, found[1].seq_len) == (min(slopes), max(slopes))
