"""scripts/peak_spread.py: grouping peaks and the report (the measuring itself runs the real `check`)."""

from __future__ import annotations

import sys

from support import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import peak_spread  # noqa: E402

MiB = 1 << 20


def test_peaks_split_into_groups_where_neighbours_are_far_apart() -> None:
    low, high = 400 * MiB, 401 * MiB
    peaks = [high + 10_000, low, high, low + 50_000, high + 200_000]
    found = peak_spread.groups(peaks, 512 * 1024)
    assert found == [[low, low + 50_000], [high, high + 10_000, high + 200_000]]
    assert peak_spread.groups([], 512 * 1024) == []


def test_the_report_names_the_margin_the_groups_and_the_spread() -> None:
    peaks = [400 * MiB, 401 * MiB, 401 * MiB + 4096]
    text = peak_spread.report(peaks, ["fits"] * 3, 440 * MiB, 512 * 1024, "autobatch check x.py -b 8")
    assert "margin tune keeps under it: 3.00 MiB" in text
    assert "| 1 | 1 |" in text and "| 2 | 2 |" in text and "| 1.00 |" in text
    assert "Spread (highest less lowest): 1.00 MiB." in text and "fits 3" in text
