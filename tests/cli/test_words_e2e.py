"""Answers that hold, and the words they are given in (issue 33): the real command on the CPU device.

A tune that cannot answer names why (the recomputation a model cannot take, the length no sample fits at,
a batch that never reached the script), in the exit code the docs give it.
"""

from __future__ import annotations

import json

import pytest
from support import SCRIPTS, run_cli

from autobatch.errors import EXIT_NOTHING_FITS, EXIT_SCRIPT

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
