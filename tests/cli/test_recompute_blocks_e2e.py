"""Recomputation wraps the model's blocks, end to end: the real command on a decoder whose blocks keep
their MLP in an ``nn.Sequential`` (tests/scripts/decoder.py), on the CPU device.

Counting instances, detection took the ``Linear`` layers in the blocks' Sequentials (two a block) for the
blocks: recomputation wrapped single layers and found the maximum it found without. Wrapping the blocks
more than doubles it, and the result, the table and ``explain`` say what was wrapped.

The decoder runs at 4 blocks, a 512-word vocabulary and a 256-token context under a 420 MiB cap: the
Linears still outnumber the blocks, the blocks' activations still outweigh the head's, and the cap leaves
room for about 10 samples without recomputation and about 30 with it, so each probe is a few seconds.
``explain`` simulates a step under fake tensors for each of its levers, at a cost that grows with the layers
rather than the tensors' sizes: it reads the decoder at 2 blocks (its Linears, four a block with the
attention's, still outnumber them) and leaves out the vocabulary-trim lever.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import SCRIPTS, run_cli

pytestmark = pytest.mark.slow

DECODER = str(SCRIPTS / "decoder.py")
#: The issue's settings; run from a folder of the test's own, so that no autobatch.toml adds to them.
COMMON = ("--device", "cpu", "--memory", "420MiB", "--precision", "32-true", "--optimizer", "adamw")
#: The decoder's size (its argparse options), after ``--``.
SIZE = ("--", "--depth", "4", "--vocab", "512", "--context", "256")
#: The decoder ``explain`` reads: half the blocks, so half the layers each lever's simulation runs.
EXPLAIN_SIZE = ("--", "--depth", "2", "--vocab", "512", "--context", "256")


def test_recomputing_the_blocks_more_than_doubles_a_maximum_check_confirms(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    levels = (
        "--recompute-level",
        "off",
        "--recompute-level",
        "full",
    )  # the levels between: docs/levers.md
    # The maxima are the question, not the rates: no timing probes.
    tune = run_cli(
        "tune", DECODER, *COMMON, *levels, "--exact-all", "--objective", "max-batch", "--no-cache",
        "--output", str(out), *SIZE, cwd=tmp_path,
    )  # fmt: skip
    assert tune.returncode == 0, tune.stderr
    combos = {c["recompute"]: c for c in json.loads(out.read_text())["combinations"]}
    off, on = combos[False], combos[True]
    assert on["recompute_blocks"] == {"Block": 4} and "recompute_blocks" not in off
    assert "recomputes Block x 4" in tune.stderr  # the table's note
    assert off["status"] == on["status"] == "exact", tune.stderr
    assert on["max_batch_size"] >= 2 * off["max_batch_size"], (off["max_batch_size"], on["max_batch_size"])
    for combo, flag in ((off, "--no-recompute"), (on, "--recompute")):
        batch = str(combo["max_batch_size"])
        check = run_cli(
            "check", DECODER, *COMMON, flag, "--batch-size", batch, "--steps", "10", *SIZE, cwd=tmp_path
        )
        assert check.returncode == 0, check.stderr


def test_explain_names_the_blocks_its_recompute_lever_wraps(tmp_path: Path) -> None:
    options = ("--no-recompute", "--vocab-trim", "0", "-b", "8", "--json")
    proc = run_cli("explain", DECODER, *COMMON, *options, *EXPLAIN_SIZE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    levers = {lever["name"]: lever for lever in json.loads(proc.stdout)["levers"]}
    recompute, now = levers["recompute"], levers["now"]
    assert recompute["description"] == "activation checkpointing of Block x 2"
    assert recompute["predicted_max_batch_size"] >= 2 * now["predicted_max_batch_size"], (recompute, now)
