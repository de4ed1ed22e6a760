"""explain end to end: the real `autobatch explain` command on a tiny script, on the CPU device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_cli

pytestmark = pytest.mark.slow

from support import TINY

PARAMS = {
    "embed": 512 * 64,
    "blocks.0.linear": 64 * 64 + 64,
    "blocks.1.linear": 64 * 64 + 64,
    "head": 64 * 512 + 512,
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return path


#: For the tests whose question is no lever's maximum: each lever's search over fake-tensor simulations (most
#: of an explain's time) stops at 8 samples.
LEVERS_CAPPED = {"AUTOBATCH_MAX_BATCH_SIZE": "8"}


def _explain(script: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = run_cli(
        "explain", str(script), "--device", "cpu", "-p", "32-true", "-o", "adamw", "--json", *args, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_explain_adds_up_and_matches_closed_forms(tiny: Path, tmp_path: Path) -> None:
    picture = tmp_path / "explain.png"
    # the levers' searches stop at 128 samples (above the explained 64, which is what "now" is held to)
    env = {"AUTOBATCH_MAX_BATCH_SIZE": "128"}
    report = _explain(tiny, "-b", "64", "--memory", "600MiB", "--plot", str(picture), env=env)
    categories = report["categories"]
    assert sum(categories.values()) + report["residual_bytes"] == report["peak_bytes"]
    assert report["fits"] and report["peak_bytes"] <= report["budget_bytes"]
    assert categories["baseline"] > 100 << 20  # Python + torch + the script, before the model
    assert categories["parameters"] == 4 * sum(PARAMS.values())
    assert categories["optimizer_state"] == 2 * 4 * sum(PARAMS.values()) + 4 * 7  # AdamW: 2 states + steps
    assert categories["activations"] > 64 * 32 * 512 * 4  # at least the log-softmax of the logits
    assert abs(report["residual_bytes"]) < categories["baseline"] // 4
    rows = {row["name"]: row for row in report["modules"]}
    for name, count in PARAMS.items():
        assert rows[name]["params"] == count
    tokens = 64 * 32
    assert rows["head"]["output_elements"] == tokens * 512
    assert rows["head"]["macs"] == tokens * 64 * 512 and rows["head"]["flops"] == 2 * tokens * 64 * 512
    assert report["modules"][0]["memory_bytes"] == max(r["memory_bytes"] for r in report["modules"])
    levers = {lever["name"]: lever for lever in report["levers"]}
    assert levers["now"]["predicted_max_batch_size"] > 64
    assert levers["optimizer sgd"]["saving_bytes"] > 0 and levers["vocab trim 50%"]["saving_bytes"] > 0
    assert levers["accumulation"]["predicted_max_batch_size"] == 2 * levers["now"]["predicted_max_batch_size"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_a_batch_that_does_not_fit(tiny: Path) -> None:
    report = _explain(tiny, "-b", "512", "--memory", "400MiB", "--vocab-trim", "0", env=LEVERS_CAPPED)
    assert not report["fits"] and report["peak_bytes"] > report["budget_bytes"]
    assert any("does not fit" in note for note in report["notes"])
    assert sum(report["categories"].values()) + report["residual_bytes"] == report["peak_bytes"]


def test_verify_measures_every_applicable_lever(tiny: Path) -> None:
    env = {"AUTOBATCH_MAX_BATCH_SIZE": "48", "AUTOBATCH_CONFIRM_STEPS": "3", "AUTOBATCH_MAX_STEPS": "4"}
    report = _explain(tiny, "-b", "16", "--memory", "600MiB", "--verify", env=env)
    applicable = [lever for lever in report["levers"] if lever["applicable"]]
    assert {lever["name"] for lever in applicable} >= {"now", "bf16-mixed", "optimizer sgd", "vocab trim 50%"}
    for lever in applicable:
        assert lever["verified_max_batch_size"] is not None, lever
        if lever["kind"] != "accumulation":
            assert lever["verified_max_batch_size"] == lever["predicted_max_batch_size"] == 48  # capped


ATTENTION_LM = Path(__file__).resolve().parent.parent / "scripts" / "attention_lm.py"


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_explain_names_materialised_attention_scores(attention: str) -> None:
    """At a length, the (B, heads, L, L) probabilities eager attention saves are the attention-score term per
    layer, and, holding most of the activations, a lever whose saving the probe measured; sdpa saves none."""
    report = _explain(
        ATTENTION_LM, "-b", "4", "--seq-len", "256", "--memory", "512MiB", "--vocab-trim", "0",
        "--", "--attention", attention, env=LEVERS_CAPPED if attention == "sdpa" else None,
    )  # fmt: skip
    assert report["seq_len"] == 256
    scores = report["attention_scores"]
    levers = {lever["name"]: lever for lever in report["levers"]}
    if attention == "sdpa":
        assert scores["saved_bytes"] == 0 and not scores["dominates"] and "sdpa attention" not in levers
        return
    probabilities = 4 * 4 * 256 * 256 * 4  # batch x heads x L x L, fp32, per layer
    assert [layer["name"] for layer in scores["layers"]] == ["blocks.0.attention", "blocks.1.attention"]
    assert all(layer["bytes"] >= probabilities for layer in scores["layers"])
    assert scores["dominates"] and scores["share_of_activations"] > 1 / 3
    lever = levers["sdpa attention"]
    assert lever["kind"] == "attention" and lever["applicable"]
    assert lever["saving_bytes"] == scores["peak_bytes"] >= 2 * probabilities
    assert lever["predicted_max_batch_size"] > levers["now"]["predicted_max_batch_size"]
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["blocks.0.attention"]["attention_bytes"] == scores["layers"][0]["bytes"]


def test_a_length_for_a_make_batch_without_one_is_a_contract_error(tiny: Path) -> None:
    """explain and estimate: exit 3, the script's make_batch named and how to give it a length."""
    for command in (
        ("explain", "-b", "4", "--seq-len", "64"),
        ("estimate", "--no-recompute", "--seq-len", "64", "--seq-len", "128"),
    ):
        proc = run_cli(*command, str(tiny), "--device", "cpu", "--memory", "512MiB", "-p", "32-true")
        assert proc.returncode == 3, proc.stderr
        assert "--seq-len asks for sequences of 64 tokens" in proc.stderr
        assert "def make_batch(batch_size, seq_len" in proc.stderr
