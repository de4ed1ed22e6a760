"""Reuse across the grid: a combination's memory line predicted from the lines already measured."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autobatch.core import reuse
from autobatch.core.reuse import SLOPE_RATIOS
from autobatch.core.space import Combo


def Learned(precision: str, optimizer: str, recompute: bool, intercept: float, slope: float) -> reuse.Learned:  # noqa: N802
    """A measured line at recomputation off or full (the levels between are in test_levels.py)."""
    return reuse.Learned(precision, optimizer, ("full" if recompute else "off", False), intercept, slope)


def predict(precision: str, optimizer: str, recompute: bool, learned, shapes):
    return reuse.predict(Combo(precision, optimizer, "full" if recompute else "off"), learned, shapes)


# One 1000 x 1000 matrix and a 1000-vector: 1,001,000 parameters.
SHAPES: list[tuple[int, ...]] = [(1000, 1000), (1000,)]
NUMEL = 1_001_000
MiB = 1 << 20


def line(precision: str, optimizer: str, recompute: bool = False, intercept=900 * MiB, slope=3 * MiB):
    return Learned(precision, optimizer, recompute, float(intercept), float(slope))


def test_nothing_learned_predicts_nothing():
    assert predict("32-true", "adamw", False, [], SHAPES) is None


def test_a_measured_combination_predicts_its_own_line():
    got = predict("bf16-mixed", "adamw", True, [line("bf16-mixed", "adamw", True)], SHAPES)
    assert got is not None
    assert (got.intercept, got.slope, got.slope_known) == (900 * MiB, 3 * MiB, True)


@pytest.mark.parametrize(
    ("precision", "source", "target", "state_difference"),
    [
        # 4-byte states, parameter-sized: SGD none, momentum one, Adam/AdamW two.
        ("32-true", "adamw", "sgd", -2 * NUMEL * 4),
        ("32-true", "sgd", "sgd-momentum", NUMEL * 4),
        ("bf16-mixed", "sgd-momentum", "adam", NUMEL * 4),  # mixed keeps fp32 parameters and states
        ("bf16-true", "sgd", "adamw", 2 * NUMEL * 2),  # pure bf16: 2-byte states
        # Adafactor factors a matrix's second moment into a row and a column; a vector keeps a full one.
        ("32-true", "adamw", "adafactor", (1000 + 1000 + 1000) * 4 - 2 * NUMEL * 4),
    ],
)
def test_another_optimizer_keeps_the_slope_and_moves_the_intercept_by_the_state_difference(
    precision, source, target, state_difference
):
    measured = line(precision, source)
    got = predict(precision, target, False, [measured], SHAPES)
    assert got is not None
    assert got.slope == measured.slope and got.slope_known
    assert got.intercept == pytest.approx(measured.intercept + state_difference)
    assert got.basis == f"{precision}/{source} slope"


def test_a_slope_measured_at_the_setting_beats_a_typical_ratio_from_the_same_optimizer():
    same_optimizer = line("32-true", "adamw", slope=10 * MiB)
    same_setting = line("bf16-mixed", "sgd", slope=4 * MiB)  # not 0.7 x 10 MiB: measured wins
    for learned in ([same_optimizer, same_setting], [same_setting, same_optimizer]):
        got = predict("bf16-mixed", "adamw", False, learned, SHAPES)
        assert got is not None
        assert got.slope == 4 * MiB and got.slope_known
        assert got.intercept == pytest.approx(same_setting.intercept + 2 * NUMEL * 4)


def test_the_same_optimizer_is_preferred_among_lines_at_the_setting():
    adamw = line("32-true", "adamw", intercept=1000 * MiB, slope=5 * MiB)
    sgd = line("32-true", "sgd", intercept=100 * MiB, slope=6 * MiB)
    got = predict("32-true", "adamw", False, [sgd, adamw], SHAPES)
    assert got is not None and (got.intercept, got.slope) == (1000 * MiB, 5 * MiB)


@pytest.mark.parametrize(
    ("source", "target", "static_difference"),
    [
        # autocast caches a 2-byte copy of every parameter; parameters, gradients and states stay fp32
        (("32-true", False), ("bf16-mixed", False), NUMEL * 2),
        (("32-true", False), ("16-mixed", True), NUMEL * 2),
        # pure bf16 halves parameters, gradients and AdamW's two states: 4 x 2 bytes saved per element
        (("32-true", False), ("bf16-true", False), -4 * NUMEL * 2),
        (("bf16-true", True), ("32-true", True), 4 * NUMEL * 2),
        # recomputation alone changes only the slope
        (("32-true", False), ("32-true", True), 0),
    ],
)
def test_another_setting_scales_the_slope_by_a_typical_ratio_that_is_not_known(
    source, target, static_difference
):
    measured = line(source[0], "adamw", source[1])
    got = predict(target[0], "adamw", target[1], [measured], SHAPES)
    assert got is not None and not got.slope_known  # the runner spends a calibration probe on it
    ratio = SLOPE_RATIOS[target] / SLOPE_RATIOS[source]
    assert got.slope == pytest.approx(measured.slope * ratio)
    assert got.intercept == pytest.approx(measured.intercept + static_difference)
    assert "typical ratio" in got.basis and f"{ratio:.2f}" in got.basis


def test_every_setting_has_a_typical_ratio():
    precisions = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")
    assert set(SLOPE_RATIOS) == {(p, r) for p in precisions for r in (False, True)}
    assert all(SLOPE_RATIOS[(p, True)] < SLOPE_RATIOS[(p, False)] for p in precisions)


OPTIMIZERS = st.sampled_from(["sgd", "sgd-momentum", "adam", "adamw", "adamw-fused", "adafactor", "rmsprop"])


@given(
    precision=st.sampled_from(["32-true", "bf16-mixed", "16-mixed", "bf16-true"]),
    first=OPTIMIZERS,
    second=OPTIMIZERS,
    intercept=st.floats(1e6, 1e11),
    slope=st.floats(1.0, 1e9),
)
def test_moving_to_another_optimizer_and_back_is_the_identity(precision, first, second, intercept, slope):
    there = predict(precision, second, False, [Learned(precision, first, False, intercept, slope)], SHAPES)
    assert there is not None
    back = predict(
        precision, first, False, [Learned(precision, second, False, there.intercept, slope)], SHAPES
    )
    assert back is not None
    assert back.intercept == pytest.approx(intercept) and back.slope == slope
