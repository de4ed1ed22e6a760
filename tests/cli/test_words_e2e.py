"""Answers that hold, and the words they are given in (issue 33): the real command on the CPU device.

A tune that cannot answer names why (the recomputation a model cannot take, the length no sample fits at,
a batch that never reached the script), in the exit code the docs give it.
"""

from __future__ import annotations

import json

import pytest
from support import SCRIPTS, run_cli

from autobatch.errors import EXIT_NOTHING_FITS, EXIT_SCRIPT, EXIT_USAGE

pytestmark = pytest.mark.slow

CPU = ("--device", "cpu", "--memory", "512MiB", "--no-cache")


def test_a_recompute_level_asked_of_a_model_without_blocks_is_a_contract_error(tmp_path) -> None:
    proc = run_cli(
        "tune", str(SCRIPTS / "small_cnn.py"), *CPU, "-p", "32-true", "-o", "adamw",
        "--recompute-level", "selective", "--output", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "no repeated blocks" in err and "selective" in err, err
    assert "--recompute-class" in err and "nothing fits" not in err


def test_a_length_no_sample_fits_at_is_named(tmp_path) -> None:
    proc = run_cli(
        "tune", str(SCRIPTS / "attention_lm.py"), *CPU, "-p", "32-true", "-o", "adamw",
        "--recompute-level", "off", "--seq-len", str(10**12), "--output", str(tmp_path / "r.json"), "--json",
    )  # fmt: skip
    assert proc.returncode == EXIT_NOTHING_FITS, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "1,000,000,000,000 tokens" in err and "--seq-len" in err, err
    assert "try bf16" not in err
    (combo,) = json.loads((tmp_path / "r.json").read_text())["combinations"]
    assert "at 1,000,000,000,000 tokens per sample" in combo["reason"], combo


@pytest.mark.exclusive  # it reads step times: a neighbour test made one probe's steps 4x slower than another's
def test_a_script_that_ignores_its_batch_size_is_an_error_naming_the_placeholder(tmp_path) -> None:
    proc = run_cli(
        "tune", str(SCRIPTS / "as_is" / "ignores_batch_size.py"), *CPU, "--output", str(tmp_path / "r.json"),
        "--", "--batch-size", "{batch}",
    )  # fmt: skip
    assert proc.returncode == EXIT_SCRIPT, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "never reached the script's step" in err and "`--batch-size {batch}` in its arguments" in err, err


def test_a_script_whose_later_batches_are_longer_is_told_in_its_own_words(tmp_path) -> None:
    proc = run_cli(
        "tune", str(SCRIPTS / "as_is" / "bucketed.py"), *CPU, "--output", str(tmp_path / "r.json"),
        "--", "--batch-size", "{batch}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "the peak depends on the data" in err, err
    assert "the script's first batches must be its worst case" in err and "make_batch" not in err


def test_a_script_that_accumulates_itself_is_planned_with_its_own_accumulation(tmp_path) -> None:
    # accumulates.py runs 4 backward passes per optimizer step: 512 a micro-batch reach 2048 by themselves
    proc = run_cli(
        "tune", str(SCRIPTS / "as_is" / "accumulates.py"), *CPU, "--global-batch-size", "2048", "--json",
        "--max-batch-size", "4096",
        "--output", str(tmp_path / "r.json"), "--emit", f"args={tmp_path / 'run.sh'}", "--", "--batch-size", "{batch}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    chosen = json.loads(proc.stdout)["chosen"]
    assert (chosen["micro_batch_size"], chosen["accumulation_steps"], chosen["global_batch_size"]) == (
        512,
        4,
        2048,
    )
    assert chosen["script_accumulation"] == 4
    err = " ".join(proc.stderr.split())
    assert "micro-batch 512 x accumulation 4 (the script's own 4) x world 1 = global 2048" in err, err
    line = (tmp_path / "run.sh").read_text().splitlines()[-1]
    assert line.endswith("accumulates.py --batch-size 512"), line


def test_a_global_batch_the_scripts_own_accumulation_cannot_reach_is_refused_with_the_arithmetic(
    tmp_path,
) -> None:
    proc = run_cli(
        "tune", str(SCRIPTS / "as_is" / "accumulates.py"), *CPU, "--global-batch-size", "2048",
        "--max-batch-size", "256", "--output", str(tmp_path / "r.json"), "--", "--batch-size", "{batch}",
    )  # fmt: skip
    assert proc.returncode == EXIT_USAGE, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "global batch 2048 = micro-batch x 4 (the script's own accumulation" in err, err
    assert "needs micro-batch 512, above the maximum 256" in err and "{accum}" in err
