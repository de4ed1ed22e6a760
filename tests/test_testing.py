"""The fake probes and synthetic curves of autobatch.testing (the oracle the search tests rely on)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autobatch.core.search import Observation
from autobatch.testing import FakeProbe, affine, noisy, quadratic, staircase, true_max


def test_curves_compute_their_formulas() -> None:
    assert affine(100, 3)(10) == 130
    assert affine(100.5, 0.25)(1) == 101  # ceil: a curve is whole bytes
    assert quadratic(10, 2, 0.5)(4) == 10 + 8 + 8
    assert staircase(100, 3, 64)(10) == 192  # 130 rounded up to a 64-byte segment
    assert staircase(0, 1, 64)(64) == 64
    with pytest.raises(ValueError):
        staircase(0, 1, 0)
    with pytest.raises(ValueError):
        noisy(affine(0, 1), rel=1.5)


@given(st.integers(1, 10_000), st.integers(0, 1000), st.floats(0, 0.1))
def test_noisy_changes_measurements_only(batch: int, seed: int, rel: float) -> None:
    base = affine(1_000_000, 997)
    curve = noisy(base, rel=rel, seed=seed)
    assert curve(batch) == base(batch)  # feasibility follows the true curve
    measured = curve.measure(batch)
    assert measured == curve.measure(batch)  # deterministic per (seed, batch)
    assert abs(measured - base(batch)) <= rel * base(batch) + 1


def test_noisy_is_noisy() -> None:
    curve = noisy(affine(1_000_000, 1000), rel=0.05, seed=3)
    errors = {curve.measure(b) - curve(b) for b in range(1, 50)}
    assert len(errors) > 10


def test_fake_probe_answers_and_records() -> None:
    probe = FakeProbe(affine(100, 3), budget_bytes=1000, throughput=lambda b: 10.0 * b)
    assert probe(300) == Observation(300, True, peak_bytes=1000, samples_per_second=3000.0)
    assert probe(301) == Observation(301, False, kind="oom")
    assert probe(5).peak_bytes == 115
    assert probe.calls == [300, 301, 5]


def test_fake_probe_options() -> None:
    probe = FakeProbe(affine(100, 3), budget_bytes=1000, fail_kind="crash", report_peaks=False)
    assert probe(10) == Observation(10, True)
    assert probe(400).kind == "crash"
    measured = FakeProbe(noisy(affine(10**6, 10**4), rel=0.05, seed=1), budget_bytes=10**7)(7)
    assert measured.peak_bytes is not None and measured.peak_bytes != affine(10**6, 10**4)(7)


def test_fake_probe_accepts_plain_callables() -> None:
    probe = FakeProbe(lambda b: 50 * b, budget_bytes=1000)
    assert probe(20).fits and not probe(21).fits
    assert probe(20).peak_bytes == 1000


def test_true_max_brute_force() -> None:
    curve = affine(100, 3)
    assert true_max(curve, 1000, 1000) == 300
    assert true_max(curve, 1000, 1000, multiple=8) == 296
    assert true_max(curve, 1000, 256) == 256
    assert true_max(curve, 102, 1000) is None
    assert true_max(curve, 1000, 7, multiple=8) is None  # no candidate at all
    # The first failure decides, even if a larger batch would "fit" a non-monotone curve.
    assert true_max(lambda b: 0 if b != 5 else 10, 1, 100) == 4


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 10**4), st.integers(1, 8))
def test_true_max_matches_closed_form_for_affine(a: int, k: int, multiple: int) -> None:
    budget = 10**7
    expected_any = (budget - a) // k
    expected = min(expected_any, 2000) // multiple * multiple
    assert true_max(affine(a, k), budget, 2000, multiple) == (expected or None)


def test_testing_module_does_not_import_torch() -> None:
    code = "import sys, autobatch.testing; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
