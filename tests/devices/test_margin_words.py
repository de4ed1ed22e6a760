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


def early_warning(budget: int, peak: int) -> str:
    from autobatch.devices.budget import EarlyWarning

    said: list[str] = []
    assert EarlyWarning("cpu", budget, said.append).check(peak)
    return said[0]


def test_the_early_warning_of_a_peak_past_the_budget_says_how_far_past() -> None:
    # seen: "peak 604 MiB, within 3 MiB of its budget 549 MiB" of a peak already 55 MiB over it
    text = early_warning(549 * MiB, 604 * MiB)
    assert "604.00 MiB, 55.00 MiB past its budget 549.00 MiB, into the headroom" in text
    assert "within" not in text and "under" not in text and "may run out of memory later" in text


def test_the_early_warning_of_a_peak_within_the_margin_says_how_far_under() -> None:
    text = early_warning(549 * MiB, 547 * MiB)
    assert "547.00 MiB, 2.00 MiB under its budget 549.00 MiB (the warning's margin is" in text
    assert "past" not in text and "headroom" not in text
    assert early_warning(549 * MiB, 549 * MiB).startswith(
        "the job's peak reached 549.00 MiB, its budget 549.00 MiB:"
    )
