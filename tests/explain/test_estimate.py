"""estimate: the search over simulations, the calibrations, card profiles, targets, and the command."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from support import TINY, run_cli

from autobatch.errors import UsageError
from autobatch.explain.parent.estimator import EstimateDevice, cuda_budget_bytes
from autobatch.explain.pure.cards import CARDS, generic_card, get_card
from autobatch.explain.pure.maxima import (
    Offset,
    SimResult,
    calibrated_offset,
    estimate_scenario,
    to_combo_result,
)
from autobatch.explain.pure.records import Scenario
from autobatch.records.result import ComboResult

SCENARIO = Scenario("32-true", "adamw", False)


def _simulator(curve, fail_above: int | None = None):
    calls: list[int] = []

    def simulate(scenario: Scenario, batch: int) -> SimResult:
        calls.append(batch)
        if fail_above is not None and batch > fail_above:
            return SimResult(batch, ok=False, error="RuntimeError: data-dependent shape")
        return SimResult(
            batch, device_peak=curve(batch), static={"parameters": 10, "gradients": 10, "optimizer_state": 20}
        )

    return simulate, calls


@pytest.mark.parametrize(
    ("curve", "expected"),
    [
        (lambda b: 1000 + 100 * b, 89),  # affine: (10_000 - 50 - 1000) // 100
        (lambda b: 1000 + 3 * b * b, 54),  # quadratic (a batch x batch matrix)
        (lambda b: 1000 + 2048 * ((100 * b + 2047) // 2048), 81),  # staircase (2 KiB segments)
    ],
)
def test_estimate_finds_the_exact_simulated_maximum(curve, expected: int) -> None:
    simulate, calls = _simulator(curve)
    found = estimate_scenario(
        "x", SCENARIO, simulate, offset=Offset(50), budget_bytes=10_000, max_batch_size=4096
    )
    assert found.status == "exact" and found.max_batch_size == expected
    assert 50 + curve(expected) <= 10_000 < 50 + curve(expected + 1)
    assert len(calls) == len(set(calls)) == len(found.trace) <= 2 * 12 + 3
    assert found.static_bytes == {"parameters": 10, "gradients": 10, "optimizer_state": 20}
    assert found.peak_bytes == 50 + curve(expected)


def test_estimate_reports_infeasible_and_simulation_errors() -> None:
    simulate, _ = _simulator(lambda b: 20_000 + b)
    assert (
        estimate_scenario(
            "x", SCENARIO, simulate, offset=Offset(0), budget_bytes=10_000, max_batch_size=64
        ).status
        == "infeasible"
    )
    simulate, _ = _simulator(lambda b: 100 * b, fail_above=4)
    found = estimate_scenario(
        "x", SCENARIO, simulate, offset=Offset(0), budget_bytes=10_000, max_batch_size=64
    )
    assert found.status == "error" and "data-dependent" in (found.error or "")


def test_calibrated_offset_is_the_gap_at_the_largest_measured_batch() -> None:
    offset = calibrated_offset([(16, 5_000), (32, 8_000)], {16: 1_000, 32: 3_000})
    assert offset.at(32) == 5_000 and offset.at(1_000) == 5_000 and offset.slope == 0


def test_combo_result_uses_tunes_schema() -> None:
    simulate, _ = _simulator(lambda b: 1000 + 100 * b)
    found = estimate_scenario(
        "x", SCENARIO, simulate, offset=Offset(0), budget_bytes=10_000, max_batch_size=4096
    )
    entry = to_combo_result(found.to_dict())
    assert isinstance(entry, ComboResult)
    assert (entry.precision, entry.optimizer, entry.recompute, entry.max_batch_size) == (
        "32-true",
        "adamw",
        False,
        90,
    )
    assert entry.probes == len(entry.trace) and all(p.kind in ("fits", "oom") for p in entry.trace)
    assert entry.static_bytes == {"parameters": 10, "gradients": 10, "optimizer_state": 20}


def test_cards_and_targets() -> None:
    assert get_card("A100-80GB") is CARDS["a100-80gb"]
    with pytest.raises(UsageError) as error:
        get_card("a100-80")
    assert "a100-80gb" in error.value.message and error.value.hint
    assert not CARDS["t4-16gb"].bf16 and CARDS["h100-80gb"].bf16
    card = generic_card(80 << 30)
    assert cuda_budget_bytes(card, 0.1) == int((card.memory_bytes - card.context_bytes) * 0.9)
    target = EstimateDevice.resolve(
        card="h100-80gb", device="auto", memory=None, headroom=0.1, given_device=False
    )
    assert target.kind == "cuda" and target.capacity_bytes == CARDS["h100-80gb"].memory_bytes
    calibrated = EstimateDevice.resolve(
        card="h100-80gb", device="auto", memory=1 << 30, headroom=0.1, given_device=False, memory_flag=1 << 30
    )
    assert calibrated.capacity_bytes == 1 << 30 and calibrated.card is not None
    assert (
        EstimateDevice.resolve(card=None, device="cpu", memory=None, headroom=0.1, given_device=True).kind
        == "cpu"
    )
    assert (
        EstimateDevice.resolve(
            card=None, device="auto", memory=8 << 30, headroom=0.1, given_device=False
        ).kind
        == "cuda"
    )
    with pytest.raises(UsageError):
        EstimateDevice.resolve(card=None, device="auto", memory=None, headroom=0.1, given_device=False)
    with pytest.raises(UsageError):
        EstimateDevice.resolve(card="t4-16gb", device="cpu", memory=None, headroom=0.1, given_device=True)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return path


@pytest.mark.slow
def test_estimate_command_cpu_and_card(tiny: Path) -> None:
    proc = run_cli(
        "estimate",
        str(tiny),
        "--device",
        "cpu",
        "--memory",
        "600MiB",
        "-p",
        "32-true",
        "-o",
        "adamw",
        "-o",
        "sgd",
        "--recompute-level",
        "off",
        "--recompute-level",
        "full",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["estimate"] is True and data["device"]["type"] == "cpu"
    assert data["device"]["baseline_bytes"] > 100 << 20
    names = {f.name for f in fields(ComboResult)}
    assert len(data["combinations"]) == 4  # 1 precision x 2 optimizers x recompute off/on
    for combo in data["combinations"]:
        # left out when empty: what recomputation wrapped, the length (no --seq-len)
        optional = {
            "recompute_blocks",
            "seq_len",
            "compile",
            "compile_seconds",
            "plan",
            "global_batch_seconds",
        }
        assert names - optional <= set(combo)
        assert combo["status"] == "exact" and combo["max_batch_size"] > 16
        assert combo["peak_bytes"] <= data["device"]["budget_bytes"]
    by_key = {(c["optimizer"], c["recompute"]): c for c in data["combinations"]}
    assert by_key[("sgd", False)]["max_batch_size"] >= by_key[("adamw", False)]["max_batch_size"]
    assert "estimate, not a measurement" in proc.stderr

    proc = run_cli(
        "estimate",
        str(tiny),
        "--card",
        "t4-16gb",
        "-p",
        "32-true",
        "-p",
        "bf16-mixed",
        "-o",
        "adamw",
        "--no-recompute",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    fp32, bf16 = data["combinations"]
    assert fp32["max_batch_size"] > 1000 and data["device"]["card"]["name"] == "t4-16gb"
    assert bf16["status"] == "skipped" and "bfloat16" in bf16["reason"]
    assert "SDPA" in proc.stderr or "scaled_dot_product_attention" in proc.stderr


def test_list_cards() -> None:
    proc = run_cli("estimate", "--list-cards", "--json")
    assert proc.returncode == 0, proc.stderr
    assert {card["name"] for card in json.loads(proc.stdout)} == set(CARDS)


@pytest.mark.parametrize("fixed", [0, 5_000])
def test_rising_phase_peaks_seed_the_search_to_a_few_simulations(fixed: int) -> None:
    """The forward/backward peak is flat while fixed-size buffers set it, then affine (FSDP at small
    batches); the optimizer step's peak is flat: secant steps on the rising peaks bracket the maximum."""
    calls: list[int] = []

    def simulate(scenario: Scenario, batch: int) -> SimResult:
        calls.append(batch)
        rising = max(3_000 + fixed, 3_000 + 7 * batch)
        return SimResult(batch, device_peak=max(rising, 9_000), rising_peak=rising)

    found = estimate_scenario(
        "x", SCENARIO, simulate, offset=Offset(50), budget_bytes=1_000_000, max_batch_size=1 << 20
    )
    expected = (1_000_000 - 50 - 3_000) // 7
    assert found.status == "exact" and found.max_batch_size == expected
    assert len(calls) == len(set(calls)) <= 7, calls


SEQUENCE_FIRST = """
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def make_batch(batch_size):  # time first: (steps, batch, features)
    return torch.randn(8, batch_size, 16), torch.randint(0, 4, (8, batch_size))


def compute_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x).reshape(-1, 4), y.reshape(-1))
"""


@pytest.mark.slow
def test_estimate_honours_the_batch_size_check_setting(tmp_path: Path) -> None:
    """A sequence-first script breaks the leading-dimension check; turning the check off (as its hint
    says) lets the fake-tensor simulations run, as it lets tune's probes run."""
    script = tmp_path / "seq.py"
    script.write_text(SEQUENCE_FIRST)
    common = (
        "estimate",
        str(script),
        "-d",
        "cpu",
        "-m",
        "400MiB",
        "-p",
        "32-true",
        "-o",
        "sgd",
        "--no-recompute",
    )
    refused = run_cli(*common)
    assert refused.returncode == 3, refused.stderr
    assert "leading dimension" in refused.stderr and "--no-check-batch-size" in refused.stderr
    for off in (("--no-check-batch-size",), ()):
        env = {} if off else {"AUTOBATCH_CHECK_BATCH_SIZE": "0"}
        proc = run_cli(*common, *off, "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        (combo,) = json.loads(proc.stdout)["combinations"]
        assert combo["status"] == "exact" and combo["max_batch_size"] > 100


ATTENTION_LM = Path(__file__).resolve().parent.parent / "scripts" / "attention_lm.py"


@pytest.mark.slow
@pytest.mark.parametrize(("attention", "share"), [("eager", (0.5, 1.0)), ("sdpa", (0.0, 0.05))])
def test_estimate_at_two_lengths(attention: str, share: tuple[float, float]) -> None:
    """The maximum per length falls as the length grows; the surface's L² share is large for attention that
    materialises its scores and about nothing for scaled_dot_product_attention."""
    proc = run_cli(
        "estimate", str(ATTENTION_LM), "--device", "cpu", "--memory", "512MiB", "-p", "32-true", "-o", "adamw",
        "--no-recompute", "--seq-len", "128", "--seq-len", "512", "--json", "--", "--attention", attention,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    lengths = data["lengths"]
    assert lengths["seq_lens"] == [128, 512] and lengths["plan_seq_len"] == 512
    maxima = {(m["seq_len"], m["status"]): m["max_batch_size"] for m in lengths["maxima"]}
    assert maxima[(128, "exact")] > maxima[(256, "predicted")] > maxima[(512, "exact")] > 0
    assert [c["seq_len"] for c in data["combinations"]] == [512]
    assert data["combinations"][0]["max_batch_size"] == maxima[(512, "exact")]
    (surface,) = lengths["surfaces"]
    assert share[0] <= surface["attention_share"] <= share[1]
    assert "L² share at 512" in proc.stderr
