"""Reuse across the grid: predict a combination's memory line from combinations already measured.

Memory is close to affine in the batch size: another optimizer keeps the slope and moves the intercept by
the analytic optimizer-state difference; another precision or recomputation setting scales the slope by a
ratio (measured between other lines, else :data:`SLOPE_RATIOS`), a guess the runner calibrates with one
probe. A prediction is only a proposal: the search verifies it. Why: docs/how-a-tune-works.md ("Later
combinations").
"""

from __future__ import annotations

from dataclasses import dataclass

from autobatch.core.levels import share
from autobatch.core.model import Affine
from autobatch.core.space import Combo, optimizer_state_bytes

#: Typical activation-slope ratios against 32-true without recomputation (used until measured).
SLOPE_RATIOS: dict[tuple[str, bool], float] = {
    ("32-true", False): 1.0,
    ("bf16-mixed", False): 0.7,
    ("16-mixed", False): 0.7,
    ("bf16-true", False): 0.5,
    ("32-true", True): 0.6,
    ("bf16-mixed", True): 0.45,
    ("16-mixed", True): 0.45,
    ("bf16-true", True): 0.3,
}


#: How a combination recomputes and compiles: (recomputation level, compile). Lines at the same mode and
#: precision share their slope; another mode or precision scales it by a ratio.
Mode = tuple[str, bool]


@dataclass(frozen=True)
class Learned:
    """A measured combination's fitted line."""

    precision: str
    optimizer: str
    mode: Mode
    intercept: float
    slope: float
    of_readings: bool = False  # the line follows the rising phase's readings (:class:`~.model.Affine`)

    @classmethod
    def of(cls, combo: Combo, line: Affine) -> Learned:
        """The line a combination's search reported."""
        mode = (combo.recompute_level, combo.compile)
        return cls(combo.precision, combo.optimizer, mode, line.intercept, line.slope, line.of_readings)


@dataclass(frozen=True)
class Prediction:
    intercept: float
    slope: float
    basis: str  # which measurement it came from, for the result's notes
    slope_known: bool = True  # False when the slope is a typical ratio, not measured
    #: The measured slope a guessed one was scaled from (None: not a guess); the search falls back on it
    #: when the guess proves too low (:func:`autobatch.core.maximum.calibrate`).
    base_slope: float | None = None
    of_readings: bool = False  # as the measured line it came from


def _elem(precision: str) -> int:
    return 2 if precision == "bf16-true" else 4


def _static(precision: str, optimizer: str, shapes: list[tuple[int, ...]]) -> float:
    elem = _elem(precision)
    numel = sum(_numel(s) for s in shapes)
    params_and_grads = 2 * numel * elem
    autocast_copies = numel * 2 if precision.endswith("-mixed") else 0
    return params_and_grads + autocast_copies + optimizer_state_bytes(optimizer, shapes, elem)


def predict(combo: Combo, learned: list[Learned], shapes: list[tuple[int, ...]]) -> Prediction | None:
    """Predict the line of ``combo`` from measured lines; None without any."""
    if not learned:
        return None
    precision, optimizer = combo.precision, combo.optimizer
    target: Setting = (precision, (combo.recompute_level, combo.compile))

    def rank(item: Learned) -> tuple[int, int]:
        same_setting = (item.precision, item.mode) == target
        same_optimizer = item.optimizer == optimizer
        return (0 if same_setting else 1, 0 if same_optimizer else 1)

    def typical(item: Learned) -> int:
        return sum(f[1] == "typical" for f in _factors(item, target, learned))

    # A measured line at the setting first; else the one whose slope needs the fewest typical ratios
    # (a ratio another pair of combinations measured is better than a typical one); the same optimizer.
    base = min(learned, key=lambda item: (rank(item)[0], typical(item), rank(item)[1]))
    intercept = (
        base.intercept
        - _static(base.precision, base.optimizer, shapes)
        + _static(precision, optimizer, shapes)
    )
    if (base.precision, base.mode) == target:
        return Prediction(
            intercept, base.slope, f"{base.precision}/{base.optimizer} slope", of_readings=base.of_readings
        )
    factors = _factors(base, target, learned)
    ratio = 1.0
    for value, _kind in factors:
        ratio *= value
    kinds = " and ".join(sorted({kind for _, kind in factors}))
    return Prediction(
        intercept,
        base.slope * ratio,
        f"{base.precision}/{base.optimizer} slope x {ratio:.2f} ({kinds} ratio)",
        slope_known=False,
        base_slope=base.slope,
        of_readings=base.of_readings,
    )


#: (precision, mode): what a slope depends on.
Setting = tuple[str, Mode]


def _factors(base: Learned, target: Setting, learned: list[Learned]) -> list[tuple[float, str]]:
    """The slope ratios from ``base``'s setting to ``target``: the precision's, then the mode's, each
    measured when another pair of lines differs by just that (on this model, not a typical one)."""
    slopes = {(item.precision, item.mode): item.slope for item in learned if item.slope > 0}
    precisions, modes = {p for p, _ in slopes}, {m for _, m in slopes}
    (precision, mode), out = target, []
    steps = [
        ((base.precision, base.mode), (precision, base.mode)),
        ((precision, base.mode), (precision, mode)),
    ]
    for source, goal in steps:
        if source == goal:
            continue
        measured = [
            slopes[(goal[0], other)] / slopes[(source[0], other)]
            for other in modes
            if source[1] == goal[1] and (goal[0], other) in slopes and (source[0], other) in slopes
        ] + [
            slopes[(other, goal[1])] / slopes[(other, source[1])]
            for other in precisions
            if source[0] == goal[0] and (other, goal[1]) in slopes and (other, source[1]) in slopes
        ]
        if measured:
            out.append((measured[0], "measured"))
        else:
            out.append((_typical(goal) / _typical(source), "typical"))
    return out


def _typical(setting: Setting) -> float:
    """The typical slope ratio of a setting against 32-true without recomputation (:data:`SLOPE_RATIOS`):
    a partial level between off and full by its share, selective halfway (geometrically), compile as without
    (its own effect is measured, never guessed); 1.0 for a precision of a script's own (script:NAME)."""
    precision, (level, _compile) = setting
    off, full = SLOPE_RATIOS.get((precision, False), 1.0), SLOPE_RATIOS.get((precision, True), 1.0)
    part = share(level)
    if part is not None:
        return off + part * (full - off)
    return (off * full) ** 0.5


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
