"""Levers: what bf16, a lighter optimizer, recomputation, accumulation, in-place activations and a
smaller vocabulary would save, and the largest batch each would give.

:func:`plan_levers` lists them; :func:`apply_predictions` turns each lever's fake-tensor simulation
(:mod:`autobatch.explain.worker.simulate`), calibrated on the measured step, into its predicted line and
maximum; :func:`plan_accumulation` and :func:`ranked` finish the table. How a prediction is calibrated:
docs/explain-estimate.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autobatch.core.space import Combo
from autobatch.explain.pure.records import Scenario, Transforms

#: Optimizers with less state than Adam that the levers try.
LIGHT_OPTIMIZERS: tuple[str, ...] = ("sgd", "sgd-momentum", "adafactor")
DEFAULT_VOCAB_TRIM = 0.5


@dataclass
class Lever:
    """One lever: what it changes, and what it was predicted (and, with --verify, measured) to give."""

    name: str
    kind: str  # now | precision | optimizer | recompute | accumulation | inplace | vocab
    description: str
    scenario: Scenario | None = None
    applicable: bool = True
    reason: str | None = None
    predicted_max_batch_size: int | None = None
    predicted_peak_bytes: int | None = None  # at the explained batch size
    saving_bytes: int | None = None  # at the explained batch size, against now
    static_bytes: float | None = None  # intercept of the predicted line
    bytes_per_sample: float | None = None
    accumulation_steps: int | None = None
    micro_batch_size: int | None = None
    verified_max_batch_size: int | None = None
    verify_probes: int = 0

    @property
    def error(self) -> float | None:
        """Predicted over measured maximum, minus one (None until verified)."""
        if self.predicted_max_batch_size is None or not self.verified_max_batch_size:
            return None
        return self.predicted_max_batch_size / self.verified_max_batch_size - 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scenario"] = self.scenario.to_dict() if self.scenario else None
        data["error"] = self.error
        return data


def plan_levers(
    now: Combo,
    *,
    unsupported: dict[str, str],
    recompute_blocks: list[str],
    has_embedding: bool,
    vocab_trim: float,
    blocks: int = 0,
) -> list[Lever]:
    """Every lever for this combination, the ones that cannot apply with their reason (``blocks``: how many
    repeated blocks recomputation wraps, for the levels between off and full)."""
    return [
        Lever("now", "now", f"{now.key} as measured", Scenario(now.precision, now.optimizer, now.recompute)),
        _bf16(now, unsupported),
        *(
            Lever(
                f"optimizer {optimizer}",
                "optimizer",
                f"{optimizer} instead of {now.optimizer}",
                Scenario(now.precision, optimizer, now.recompute),
            )
            for optimizer in LIGHT_OPTIMIZERS
            if optimizer != now.optimizer
        ),
        _recompute(now, recompute_blocks),
        *_levels(now, recompute_blocks, blocks),
        Lever("accumulation", "accumulation", "gradient accumulation over micro-batches"),
        Lever(
            "in-place activations",
            "inplace",
            "ReLU-family activations computed in place",
            Scenario(now.precision, now.optimizer, now.recompute, Transforms(inplace=True)),
        ),
        _vocab(now, has_embedding, vocab_trim),
    ]


def _bf16(now: Combo, unsupported: dict[str, str]) -> Lever:
    lever = Lever(
        "bf16-mixed",
        "precision",
        "autocast to bfloat16 (fp32 parameters, half-size activations)",
        Scenario("bf16-mixed", now.optimizer, now.recompute),
    )
    if now.precision in ("bf16-mixed", "bf16-true"):
        lever.applicable, lever.reason = False, f"already {now.precision}"
    elif "bf16-mixed" in unsupported:
        lever.applicable, lever.reason = (
            False,
            f"the device cannot run bf16-mixed: {unsupported['bf16-mixed']}",
        )
    return lever


def _recompute(now: Combo, blocks: list[str]) -> Lever:
    lever = Lever(
        "recompute",
        "recompute",
        f"activation checkpointing of {', '.join(blocks) or 'the repeated blocks'}",
        Scenario(now.precision, now.optimizer, True),
    )
    if now.recompute:
        lever.applicable, lever.reason = False, "already on" + (f" ({', '.join(blocks)})" if blocks else "")
    elif not blocks:
        lever.applicable, lever.reason = (
            False,
            "no repeated blocks to wrap (name them with --recompute-class)",
        )
    return lever


def _levels(now: Combo, labels: list[str], blocks: int) -> list[Lever]:
    """Recomputation between off and full (autobatch.core.levels): half the blocks, and the selective
    policy; simulated like full recomputation, at their level."""
    if now.recompute or blocks < 2 or not labels:
        return []  # already recomputing, or nothing between off and full
    half = f"{blocks // 2}/{blocks}"
    what = ", ".join(labels)
    return [
        Lever(
            f"recompute {half}",
            "recompute",
            f"activation checkpointing of the first {blocks // 2} of {what}",
            Scenario(now.precision, now.optimizer, True, level=half),
        ),
        Lever(
            "recompute selective",
            "recompute",
            f"selective checkpointing of {what}: matmul and attention outputs kept, the rest recomputed",
            Scenario(now.precision, now.optimizer, True, level="selective"),
        ),
    ]


def _vocab(now: Combo, has_embedding: bool, vocab_trim: float) -> Lever:
    lever = Lever(
        f"vocab trim {vocab_trim:.0%}",
        "vocab",
        f"the largest embedding's vocabulary cut by {vocab_trim:.0%} (tied output head too)",
        Scenario(now.precision, now.optimizer, now.recompute, Transforms(vocab_trim=vocab_trim)),
    )
    if not has_embedding:
        lever.applicable, lever.reason = False, "the model has no nn.Embedding"
    elif vocab_trim <= 0:
        lever.applicable, lever.reason = False, "--vocab-trim 0"
    return lever


def apply_predictions(levers: list[Lever], estimates: dict[str, dict[str, Any]], batch_size: int) -> None:
    """Fill the levers in from the estimate operation's scenario results (keyed by lever name).

    Predictions start from the measured step, not from a model of it: the explained batch size ``N`` and ``N/2``
    are measured for real, and a lever's predicted memory at batch ``b`` is
    ``simulated_lever(b) + measured(N) - simulated_now(N)`` (:func:`autobatch.explain.pure.maxima.calibrated_offset`):
    the simulation only says what the lever *changes* (optimizer state: SGD 0, momentum 1, Adam 2 parameter-sized
    states; Adafactor a row and a column per matrix; bf16 autocast: half-size saved activations plus cached weight
    copies; recomputation: only block inputs kept), the measurement says everything else. A precision lever changes
    the kernels too (on the CPU, oneDNN's bf16 GEMMs instead of MKL's fp32 ones, which keep different buffers
    outside PyTorch's allocator), so its step is measured once at ``N`` and its prediction calibrated on that. The
    static part and the per-sample part of each prediction are reported.
    """
    now = estimates.get("now", {})
    now_peak = now.get("points", {}).get(str(batch_size))
    for lever in levers:
        found = estimates.get(lever.name)
        if found is None or not lever.applicable:
            continue
        if found.get("status") == "error":
            lever.applicable, lever.reason = False, f"cannot run: {found.get('error')}"
            continue
        applied = found.get("applied") or {}
        if lever.kind == "inplace" and not (applied.get("inplace_modules") or applied.get("inplace_calls")):
            lever.applicable, lever.reason = False, "no activation with an in-place form (GELU has none)"
            continue
        lever.predicted_max_batch_size = found.get("max_batch_size")
        lever.predicted_peak_bytes = found.get("points", {}).get(str(batch_size))
        lever.static_bytes = found.get("intercept_bytes")
        lever.bytes_per_sample = found.get("bytes_per_sample")
        if lever.predicted_peak_bytes is not None and now_peak is not None:
            lever.saving_bytes = now_peak - lever.predicted_peak_bytes
    accumulation = next(lever for lever in levers if lever.kind == "accumulation")
    base = levers[0]
    plan_accumulation(accumulation, base, batch_size)


def plan_accumulation(lever: Lever, now: Lever, batch_size: int) -> None:
    """Micro-batches that reach the explained batch size, and the effective maximum.

    Gradient accumulation does not change a micro-batch's memory: it reaches a batch ``N`` that does not fit as
    ``s`` micro-batches of ``ceil(N / s)`` (the same optimizer step, ``s`` times the forward and backward work);
    its "maximum" is the effective batch ``s * b_max``.
    """
    b_max = now.predicted_max_batch_size
    if not b_max:
        lever.applicable, lever.reason = False, "not even the smallest micro-batch fits"
        return
    steps = 2 if b_max >= batch_size else math.ceil(batch_size / b_max)
    micro = math.ceil(batch_size / steps)
    lever.accumulation_steps, lever.micro_batch_size = steps, micro
    lever.description = (
        f"{steps} micro-batches of {micro} per optimizer step (same update, {steps}x the passes)"
    )
    lever.predicted_max_batch_size = steps * b_max
    if now.bytes_per_sample is not None and now.static_bytes is not None:
        lever.static_bytes, lever.bytes_per_sample = now.static_bytes, now.bytes_per_sample
        lever.predicted_peak_bytes = int(now.static_bytes + now.bytes_per_sample * micro)
        if now.predicted_peak_bytes is not None:
            lever.saving_bytes = now.predicted_peak_bytes - lever.predicted_peak_bytes


def ranked(levers: list[Lever]) -> list[Lever]:
    """``now`` first, then applicable levers by predicted maximum (then saving), then the others."""
    now = [lever for lever in levers if lever.kind == "now"]
    usable = [lever for lever in levers if lever.kind != "now" and lever.applicable]
    others = [lever for lever in levers if lever.kind != "now" and not lever.applicable]
    usable.sort(key=lambda lever: (-(lever.predicted_max_batch_size or -1), -(lever.saving_bytes or 0)))
    return now + usable + others
