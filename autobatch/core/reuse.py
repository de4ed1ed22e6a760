"""Reuse across the grid: predict a combination's memory line from combinations already measured.

Memory is close to affine in the batch size, ``peak(b) = intercept + slope * b``. The intercept
holds the static memory (parameters, gradients, optimizer state, the process itself) and the slope
the activations kept for backward. So:

* another optimizer at the same precision and recomputation has the same slope, and an intercept
  that differs by the analytic optimizer-state difference (SGD 0, momentum 1, Adam/AdamW 2
  parameter-sized states, Adafactor factored);
* another precision or recomputation setting changes the slope by a typical ratio
  (:data:`SLOPE_RATIOS`), a guess the runner calibrates with one probe. A ratio measured on another
  optimizer would need the target setting measured, and then its slope is taken directly (a
  measured slope at the same setting always wins).

A prediction is only a proposal: the search verifies it with a probe on each side of the boundary,
so a wrong guess costs probes, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

from .space import optimizer_state_bytes

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


@dataclass(frozen=True)
class Learned:
    """A measured combination's fitted line."""

    precision: str
    optimizer: str
    recompute: bool
    intercept: float
    slope: float


@dataclass(frozen=True)
class Prediction:
    intercept: float
    slope: float
    basis: str  # which measurement it came from, for the result's notes
    slope_known: bool = True  # False when the slope is a typical ratio, not measured


def _elem(precision: str) -> int:
    return 2 if precision == "bf16-true" else 4


def _static(precision: str, optimizer: str, shapes: list[tuple[int, ...]]) -> float:
    elem = _elem(precision)
    numel = sum(_numel(s) for s in shapes)
    params_and_grads = 2 * numel * elem
    autocast_copies = numel * 2 if precision.endswith("-mixed") else 0
    return params_and_grads + autocast_copies + optimizer_state_bytes(optimizer, shapes, elem)


def predict(
    precision: str, optimizer: str, recompute: bool, learned: list[Learned], shapes: list[tuple[int, ...]]
) -> Prediction | None:
    """Predict the line of (precision, optimizer, recompute) from measured lines; None without any."""
    if not learned:
        return None
    target = (precision, recompute)

    def rank(item: Learned) -> tuple[int, int]:
        same_setting = (item.precision, item.recompute) == target
        same_optimizer = item.optimizer == optimizer
        return (0 if same_setting else 1, 0 if same_optimizer else 1)

    base = min(learned, key=rank)
    intercept = (
        base.intercept
        - _static(base.precision, base.optimizer, shapes)
        + _static(precision, optimizer, shapes)
    )
    if (base.precision, base.recompute) == target:
        return Prediction(intercept, base.slope, f"{base.precision}/{base.optimizer} slope")
    ratio = SLOPE_RATIOS[target] / SLOPE_RATIOS[(base.precision, base.recompute)]
    return Prediction(
        intercept,
        base.slope * ratio,
        f"{base.precision}/{base.optimizer} slope x {ratio:.2f} (typical ratio)",
        slope_known=False,
    )


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
