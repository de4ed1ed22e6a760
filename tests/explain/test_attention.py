"""explain and estimate at a sequence length, in this process (no probe server): the saved (.., L, L) tensors
per module, the tracker's count of them at the peak, the attention lever, the simulation at a length and the
table over lengths."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from autobatch.core.space import Combo
from autobatch.core.step_peaks import StepRule
from autobatch.errors import ContractError
from autobatch.explain.output.render import print_attention, print_estimate_lengths
from autobatch.explain.parent.estimate_lengths import add_lengths, rows_at
from autobatch.explain.pure.attention_lever import THRESHOLD, attention_lever, attention_section
from autobatch.explain.pure.levers import Lever
from autobatch.explain.pure.records import Scenario, Transforms
from autobatch.explain.worker.breakdown import Instrument
from autobatch.explain.worker.modules import is_square_in
from autobatch.explain.worker.simulate import simulate
from autobatch.explain.worker.tracker import MemoryTracker
from autobatch.records.result import ComboResult, TuneResult
from autobatch.step.contract import UserScript, load_script
from autobatch.step.loop import StepConfig, StepReport, run_steps

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "attention_lm.py"
HEADS, DEPTH = 4, 2  # tests/scripts/attention_lm.py
ONE_SHAPE = """
import torch

def build_model():
    return torch.nn.Linear(8, 8)

def make_batch(batch_size):
    return torch.zeros(batch_size, 32, 8)

def compute_loss(model, batch):
    return model(batch).sum()
"""


@pytest.fixture
def lm(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # load_script sets the script's arguments

    def load(attention: str) -> UserScript:
        return load_script(SCRIPT, ["--attention", attention])

    return load


def _run(script: UserScript, batch: int, seq_len: int | None) -> Instrument:
    instrument = Instrument(Transforms(), MemoryTracker(), seq_len=seq_len)
    with instrument:
        run_steps(
            instrument.wrap(script),
            StepConfig(batch, "32-true", "adamw", seq_len=seq_len),
            StepReport(),
            StepRule(2, 2, 0),
            peak_now=lambda: 0,
            synchronize=lambda: None,
        )
    return instrument


@pytest.mark.slow
def test_eager_attention_saves_its_probabilities_per_layer(lm: Any) -> None:
    batch, seq_len = 3, 40
    instrument = _run(lm("eager"), batch, seq_len)
    found = instrument.attention()
    assert found is not None and not found["width_clash"]
    # per layer: the softmax's (batch, heads, L, L) output (fp32), which the matmul with v saves too (one
    # storage), and masked_fill's (L, L) boolean mask
    per_layer = batch * HEADS * seq_len * seq_len * 4 + seq_len * seq_len
    assert found["layers"] == [{"name": f"blocks.{i}.attention", "bytes": per_layer} for i in range(DEPTH)]
    assert found["saved_bytes"] == DEPTH * per_layer
    assert found["peak_bytes"] == DEPTH * per_layer  # all of them alive at the peak (the end of the forward)
    rows = {row["name"]: row for row in instrument.modules()}
    assert rows["blocks.0.attention"]["attention_bytes"] == per_layer
    assert rows["blocks.0.attention"]["saved_bytes"] > per_layer  # q, k and v too
    assert rows["blocks.0.mlp.0"]["attention_bytes"] == 0


def test_sdpa_saves_no_square_tensor(lm: Any) -> None:
    found = _run(lm("sdpa"), 3, 40).attention()
    assert found is not None
    assert found["saved_bytes"] == found["peak_bytes"] == 0 and found["layers"] == []


def test_without_a_length_nothing_is_singled_out(lm: Any) -> None:
    instrument = _run(lm("eager"), 2, None)
    assert instrument.attention() is None
    assert all(row["attention_bytes"] == 0 for row in instrument.modules())


def test_the_wrapped_make_batch_keeps_its_signature(lm: Any, tmp_path: Path) -> None:
    """Whether make_batch takes a length is the script's own, through explain's wrapper; one that does not
    is told so (the ContractError every command reports with exit 3)."""
    assert Instrument(Transforms(), None).wrap(lm("eager")).takes_seq_len
    one = tmp_path / "one.py"
    one.write_text(ONE_SHAPE)
    script = load_script(one, [])
    wrapped = Instrument(Transforms(), None).wrap(script)
    assert not script.takes_seq_len and not wrapped.takes_seq_len
    with pytest.raises(ContractError, match="--seq-len asks for sequences of 32 tokens"):
        _run(script, 2, 32)


def test_a_simulation_runs_at_the_length(lm: Any) -> None:
    """Fake tensors at two lengths: eager attention's peak grows with L², sdpa's about with L."""
    scenario = Scenario("32-true", "adamw", False)

    def peak(attention: str, seq_len: int) -> int:
        result = simulate(
            lm(attention), scenario, 4, target="exact", step=StepConfig(4, "32-true", "sgd", seq_len=seq_len)
        )
        assert result.ok, result.error
        return result.tensor_peak

    eager = peak("eager", 256) - peak("eager", 128)
    sdpa = peak("sdpa", 256) - peak("sdpa", 128)
    assert eager > 3 * sdpa > 0
    assert eager >= DEPTH * 4 * HEADS * (256**2 - 128**2) * 4  # at least the saved probabilities


def test_the_tracker_counts_marked_storages_alive_at_the_peak() -> None:
    tracker = MemoryTracker()
    with tracker:
        scores = torch.zeros(2, 8, 8)  # 512 B
        other = torch.zeros(64)  # 256 B: the peak, 768 B
        tracker.mark(scores)  # marked after the peak's snapshot, alive at it
        tracker.mark(scores)  # once
        tracker.mark(other[:0])  # a view marks its storage
        assert tracker.marked_bytes == 768
        del other
        late = torch.zeros(2, 4, 4)  # 128 B, after the peak
        tracker.mark(late)
        assert tracker.marked_bytes == 640
        del scores, late
    assert tracker.peak.tensor_bytes == 768 and tracker.peak.marked == 768
    assert tracker.marked_bytes == 0


def test_square_tensors() -> None:
    assert is_square_in(torch.zeros(2, 4, 16, 16), 16) and is_square_in(torch.zeros(16, 16), 16)
    assert not is_square_in(torch.zeros(2, 16, 8), 16) and not is_square_in(torch.zeros(16), 16)


def _section(at_peak: int, activations: int, clash: bool = False) -> dict[str, Any] | None:
    found = {
        "seq_len": 512,
        "saved_bytes": at_peak,
        "peak_bytes": at_peak,
        "layers": [{"name": "blocks.0.attn", "bytes": at_peak}],
        "width_clash": clash,
    }
    return attention_section(found, {"activations": activations}, 10 * activations)


def test_the_lever_is_named_over_a_third_of_the_activations() -> None:
    now = Lever("now", "now", "as measured", static_bytes=1000.0, bytes_per_sample=100.0)
    now.predicted_peak_bytes = 1800
    limits = (10_000, 4096, 1)
    assert attention_lever(None, now, None, 8, limits) is None  # no --seq-len
    under = _section(int(THRESHOLD * 600) - 1, 600)
    assert under is not None and not under["dominates"]
    assert attention_lever(under, now, None, 8, limits) is None
    section = _section(480, 800)  # 60 % of the activations: 60 bytes per sample at batch 8
    assert section is not None and section["dominates"] and section["share_of_activations"] == 0.6
    lever = attention_lever(section, now, None, 8, limits)
    assert lever is not None and lever.kind == "attention" and lever.scenario is None
    assert lever.saving_bytes == 480 and lever.predicted_peak_bytes == 1800 - 480
    assert lever.bytes_per_sample == 40.0 and lever.static_bytes == 1000.0
    assert lever.predicted_max_batch_size == (10_000 - 1000) // 40
    assert "F.scaled_dot_product_attention" in lever.description and "480 B" in lever.description
    assert "not simulated or verified" in lever.description
    # without the now lever's predicted line, the measured one
    bare = attention_lever(
        section, Lever("now", "now", ""), {"static_bytes": 0.0, "bytes_per_sample": 80.0}, 8, limits
    )
    assert bare is not None and bare.predicted_max_batch_size == 10_000 // 20


def test_the_terminal_names_the_term_per_module() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, no_color=True)
    print_attention(console, _section(480, 800), 8)
    text = " ".join(out.getvalue().split())  # lines folded
    assert "attention scores (L²) at 512 tokens" in text and "blocks.0.attn" in text
    assert "60% of the activations" in text and "the sdpa attention lever" in text
    out.truncate(0)
    print_attention(console, attention_section({"seq_len": 64, "layers": []}, {"activations": 1}, 1), 8)
    assert "none saved for backward at 64 tokens" in out.getvalue()


def _found(name: str, intercept: float, slope: float, max_batch: int) -> dict[str, Any]:
    return {
        "name": name,
        "scenario": {"precision": "32-true", "optimizer": "adamw", "recompute": False},
        "status": "exact",
        "max_batch_size": max_batch,
        "intercept_bytes": intercept,
        "bytes_per_sample": slope,
        "trace": [],
    }


def test_estimates_at_several_lengths_make_tunes_table() -> None:
    """Lines of slope b·L + c·L² at two lengths: the surface finds c, the L² share at the longest length."""
    combo = Combo("32-true", "adamw")
    b, c = 1000.0, 10.0
    answers = {}
    for seq_len in (128, 512):
        slope = b * seq_len + c * seq_len * seq_len
        info = {"scenarios": [_found(combo.key, 1e6, slope, int((1e8 - 1e6) // slope))]}
        answers[seq_len] = (rows_at([None], info, seq_len), info)
    result = TuneResult("s.py", [], {"budget_bytes": 10**8}, "max-batch", answers[512][0])
    add_lengths(result, [combo], answers, 512, 1)
    assert result.lengths is not None
    maxima = {(r.seq_len, r.status): r.max_batch_size for r in result.lengths.maxima}
    assert maxima[(128, "exact")] > maxima[(256, "predicted")] > maxima[(512, "exact")]
    (surface,) = result.lengths.surfaces
    assert surface["attention_share"] == pytest.approx(c * 512 / (b + c * 512), abs=1e-3)
    assert result.combinations[0].seq_len == 512
    data = result.to_dict()
    assert [m["seq_len"] for m in data["lengths"]["maxima"]] == [128, 256, 512]
    out = io.StringIO()
    print_estimate_lengths(Console(file=out, width=200, no_color=True), result)
    assert "L² share at 512" in out.getvalue() and "~" in out.getvalue()


def test_a_skipped_combination_is_skipped_at_every_length() -> None:
    skipped = ComboResult("bf16-mixed", "adamw", False, status="skipped", reason="no bf16")
    rows = [rows_at([skipped, None], {"scenarios": [_found("x", 0, 1, 5)]}, n) for n in (64, 128)]
    assert [(r[0].status, r[0].seq_len, r[1].seq_len) for r in rows] == [
        ("skipped", 64, 64),
        ("skipped", 128, 128),
    ]
    assert skipped.seq_len is None  # copies


def test_explain_takes_one_length() -> None:
    """explain measures one batch at one length: several are refused before any probe (exit 2)."""
    from support import run_main

    code, _, err = run_main(
        "explain", str(SCRIPT), "-b", "4", "--device", "cpu", "--seq-len", "64", "--seq-len", "128"
    )
    assert code == 2 and "--seq-len was given 2 times" in err and "give one --seq-len" in err


def test_the_estimate_command_at_two_lengths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command over its probe seam: one estimate per length, the table with a column per length, the
    JSON laid out as tune's over lengths."""
    import json

    from support import run_main

    asked: list[tuple[int | None, ...]] = []

    def estimates(settings: Any, options: Any, timeout: float, lengths: tuple[int | None, ...]) -> Any:
        asked.append(lengths)
        infos = {}
        for seq_len in lengths:
            assert seq_len is not None
            slope = 1000.0 * seq_len + 10.0 * seq_len * seq_len
            found = [_found(s.name, 300e6, slope, int((1.6e9 - 300e6) // slope)) for s in options.scenarios]
            infos[seq_len] = {"scenarios": found, "baseline_bytes": 250 << 20}
        return infos, "fake"

    monkeypatch.setattr("autobatch.explain.parent.estimator._run", estimates)
    script = tmp_path / "train.py"
    script.write_text("# never imported here\n")
    code, out, err = run_main(
        "estimate", str(script), "--device", "cpu", "--memory", "2GiB", "-p", "32-true", "-o", "adamw",
        "--no-recompute", "--seq-len", "512", "--seq-len", "128", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert asked == [(128, 512)]
    data = json.loads(out)
    assert [(m["seq_len"], m["status"]) for m in data["lengths"]["maxima"]] == [
        (128, "exact"),
        (256, "predicted"),
        (512, "exact"),
    ]
    assert data["combinations"][0]["seq_len"] == 512 and data["lengths"]["plan_seq_len"] == 512
    assert data["lengths"]["surfaces"][0]["attention_share"] > 0.8
    assert "estimated max batch per sequence length" in err and "L² share at 512" in err
