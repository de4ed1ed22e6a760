"""Materialised attention scores in ``explain --seq-len L``: the ``L²`` term, and the lever that removes it.

:func:`attention_section` turns the saved tensors whose last two dimensions are both ``L`` (singled out per
module by :func:`autobatch.explain.worker.modules.is_square_in`) into the report's ``attention_scores``;
:func:`attention_lever` names them as the ``sdpa attention`` lever when they hold more than
:data:`THRESHOLD` of the activations at the peak. It is advice, neither simulated nor verified:
docs/explain-estimate.md says what it counts.
"""

from __future__ import annotations

from typing import Any

from autobatch.core.units import format_bytes
from autobatch.explain.pure.levers import Lever
from autobatch.explain.pure.sharding_lever import line_max

#: The share of the activations at the peak above which the scores are named as a lever: at a third, the
#: scores outweigh every other kind of activation of a transformer block (its inputs, q, k, v, the MLP's).
THRESHOLD = 1 / 3
ADVICE = (
    "advice: autobatch cannot rewrite the model's attention, so it is measured by this probe, not simulated "
    "or verified"
)


def attention_section(
    found: dict[str, Any] | None, categories: dict[str, int], peak_bytes: int
) -> dict[str, Any] | None:
    """The report's ``attention_scores`` from what the probe found (None without ``--seq-len``)."""
    if not found:
        return None
    at_peak = int(found.get("peak_bytes", 0))
    activations = int(categories.get("activations", 0))
    share = at_peak / activations if activations > 0 else 0.0
    return {
        "seq_len": int(found["seq_len"]),
        "saved_bytes": int(found.get("saved_bytes", 0)),
        "peak_bytes": at_peak,
        "share_of_activations": round(share, 4),
        "share_of_peak": round(at_peak / peak_bytes, 4) if peak_bytes > 0 else 0.0,
        "threshold": round(THRESHOLD, 4),
        "dominates": at_peak > 0 and share > THRESHOLD,
        "layers": [{"name": str(x["name"]), "bytes": int(x["bytes"])} for x in found.get("layers", [])],
        "width_clash": bool(found.get("width_clash", False)),
    }


def attention_lever(
    section: dict[str, Any] | None,
    now: Lever,
    line: dict[str, float] | None,
    batch_size: int,
    limits: tuple[int, int, int],
) -> Lever | None:
    """The lever of materialised scores that dominate (None otherwise); ``line``: the measured one, used
    when the ``now`` lever has no predicted line; ``limits``: budget bytes, largest batch, batch multiple."""
    if section is None or not section["dominates"]:
        return None
    saving, seq_len = int(section["peak_bytes"]), section["seq_len"]
    lever = Lever(
        "sdpa attention",
        "attention",
        f"materialised attention scores: {format_bytes(saving)} of the peak at batch {batch_size}, {seq_len} "
        "tokens; F.scaled_dot_product_attention (flash/memory-efficient kernels) keeps none: predicted saving "
        f"{format_bytes(saving)} ({ADVICE})",
    )
    lever.saving_bytes = saving
    if now.static_bytes is not None and now.bytes_per_sample is not None:
        line = {"static_bytes": now.static_bytes, "bytes_per_sample": now.bytes_per_sample}
    if now.predicted_peak_bytes is not None:
        lever.predicted_peak_bytes = now.predicted_peak_bytes - saving
    if line is not None:
        lever.static_bytes = line["static_bytes"]
        lever.bytes_per_sample = max(line["bytes_per_sample"] - saving / batch_size, 0.0)
        lever.predicted_max_batch_size = line_max(lever.static_bytes, lever.bytes_per_sample, limits)
    return lever


def attention_line(section: dict[str, Any], batch_size: int) -> str:
    """One line that says what the term is and whether it is named as a lever."""
    layers = len(section["layers"])
    if not section["saved_bytes"]:
        n = section["seq_len"]
        return f"attention scores (L²): none saved for backward at {n} tokens (no tensor of shape (.., {n}, {n}))"
    text = (
        f"attention scores (L²): {format_bytes(section['saved_bytes'])} saved for backward at {section['seq_len']} "
        f"tokens in {layers} module(s), {format_bytes(section['peak_bytes'])} at the peak of batch {batch_size}: "
        f"{section['share_of_activations']:.0%} of the activations, {section['share_of_peak']:.0%} of the peak"
    )
    if section["dominates"]:
        return text + f" (over {section['threshold']:.0%} of the activations: the sdpa attention lever)"
    if section["peak_bytes"] > 0:
        return text + f" (under {section['threshold']:.0%} of the activations: not named as a lever)"
    return text
