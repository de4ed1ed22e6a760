"""scripts/probe_counts.py: every curve family exact, and the counts issue 14 measured hold."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import probe_counts  # noqa: E402


def test_every_family_is_exact_and_phases_flatten_the_plateau() -> None:
    for name in probe_counts.CURVES:
        for phases in (False, True):
            assert probe_counts.count(name, phases)[1], (name, phases)
    assert probe_counts.count("affine", True)[0] == 4
    assert probe_counts.count("flat-then-rising", True)[0] == 4
    assert probe_counts.count("flat-then-rising", False)[0] > 12
