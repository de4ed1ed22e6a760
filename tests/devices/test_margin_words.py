"""The margin's words: a peak within the margin of the budget, and a peak above the budget itself."""

from __future__ import annotations

from autobatch.devices.budget import margin_reason

MiB = 1 << 20
GiB = 1 << 30


def test_a_peak_within_the_margin_fitted_by_less_than_it() -> None:
    text = margin_reason(4 * MiB, GiB - MiB, GiB, "a fresh process can exceed the budget")
    assert text.startswith("fitted by less than the 4.00 MiB margin") and "a fresh process" in text


def test_a_peak_above_the_budget_is_not_said_to_have_fitted() -> None:
    text = margin_reason(4 * MiB, int(1.07 * GiB), GiB, "a fresh process can exceed the budget")
    assert "fitted" not in text and "above the budget of 1.00 GiB" in text and "1.07 GiB" in text
