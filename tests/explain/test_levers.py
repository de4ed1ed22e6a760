"""The levers' plan, predictions, accumulation arithmetic and ranking (pure: no probes)."""

from __future__ import annotations

from autobatch.core.space import Combo, block_labels
from autobatch.explain.pure.levers import apply_predictions, plan_levers, ranked


def _levers(**overrides: object) -> list:
    options: dict = {
        "unsupported": {},
        "recompute_blocks": ["Block"],
        "has_embedding": True,
        "vocab_trim": 0.5,
    }
    options.update(overrides)
    return plan_levers(Combo("32-true", "adamw"), **options)


def test_plan_names_every_lever_and_why_some_cannot_apply() -> None:
    levers = {lever.name: lever for lever in _levers(has_embedding=False, recompute_blocks=[])}
    assert list(levers)[0] == "now"
    assert {
        "bf16-mixed",
        "optimizer sgd",
        "optimizer sgd-momentum",
        "optimizer adafactor",
        "recompute",
    } <= set(levers)
    assert {"accumulation", "in-place activations", "vocab trim 50%"} <= set(levers)
    assert not levers["recompute"].applicable and "repeated blocks" in (levers["recompute"].reason or "")
    assert not levers["vocab trim 50%"].applicable and "Embedding" in (levers["vocab trim 50%"].reason or "")
    bf16 = plan_levers(
        Combo("bf16-mixed", "sgd", "full"),
        unsupported={},
        recompute_blocks=["B"],
        has_embedding=True,
        vocab_trim=0.5,
    )
    names = {lever.name: lever for lever in bf16}
    assert not names["bf16-mixed"].applicable and not names["recompute"].applicable
    assert "optimizer sgd" not in names  # the optimizer in use is not a lever


def _estimate(max_batch: int, peak_at_n: int, static: float, per_sample: float, **extra: object) -> dict:
    return {
        "status": "exact",
        "max_batch_size": max_batch,
        "points": {"32": peak_at_n},
        "intercept_bytes": static,
        "bytes_per_sample": per_sample,
        "applied": extra.get("applied", {}),
    }


def test_predictions_savings_accumulation_and_ranking() -> None:
    levers = _levers()
    estimates = {
        "now": _estimate(100, 5000, 1800, 100),
        "bf16-mixed": _estimate(180, 3400, 1800, 50),
        "optimizer sgd": _estimate(110, 4600, 1400, 100),
        "optimizer sgd-momentum": _estimate(105, 4800, 1600, 100),
        "optimizer adafactor": _estimate(108, 4700, 1500, 100),
        "recompute": _estimate(300, 2500, 1800, 30),
        "in-place activations": _estimate(100, 5000, 1800, 100),  # nothing applied: not applicable
        "vocab trim 50%": {"status": "error", "error": "boom"},
    }
    apply_predictions(levers, estimates, 32)
    by_name = {lever.name: lever for lever in levers}
    assert (
        by_name["bf16-mixed"].saving_bytes == 1600 and by_name["bf16-mixed"].predicted_max_batch_size == 180
    )
    assert not by_name["in-place activations"].applicable
    assert not by_name["vocab trim 50%"].applicable and "boom" in (by_name["vocab trim 50%"].reason or "")
    accumulation = by_name["accumulation"]
    assert accumulation.accumulation_steps == 2 and accumulation.micro_batch_size == 16
    assert accumulation.predicted_max_batch_size == 200
    assert accumulation.saving_bytes == 5000 - (1800 + 100 * 16)
    order = [lever.name for lever in ranked(levers)]
    assert order[0] == "now"
    assert order[1:4] == ["recompute", "accumulation", "bf16-mixed"]
    assert set(order[-2:]) == {"in-place activations", "vocab trim 50%"}


def test_accumulation_reaches_a_batch_that_does_not_fit() -> None:
    levers = _levers()
    apply_predictions(levers, {"now": _estimate(10, 9000, 1000, 250)}, 32)
    accumulation = next(lever for lever in levers if lever.kind == "accumulation")
    assert accumulation.accumulation_steps == 4 and accumulation.micro_batch_size == 8
    assert accumulation.predicted_max_batch_size == 40


def test_error_is_predicted_over_measured() -> None:
    lever = _levers()[0]
    lever.predicted_max_batch_size, lever.verified_max_batch_size = 110, 100
    assert abs((lever.error or 0) - 0.10) < 1e-9
    assert lever.to_dict()["error"] == lever.error


def test_the_recompute_lever_names_the_blocks_and_how_many() -> None:
    labels = block_labels(["Block"], {"Block": 12})
    assert labels == ["Block x 12"] and block_labels(["Block"], {}) == ["Block"]  # a count not known
    off = {lever.name: lever for lever in _levers(recompute_blocks=labels)}["recompute"]
    assert off.applicable and off.description == "activation checkpointing of Block x 12"
    on = plan_levers(
        Combo("32-true", "adamw", "full"),
        unsupported={},
        recompute_blocks=labels,
        has_embedding=True,
        vocab_trim=0.5,
    )
    assert {lever.name: lever for lever in on}["recompute"].reason == "already on (Block x 12)"
