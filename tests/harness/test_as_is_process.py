"""The as-is harness on a tiny script run as it is: a small batch fits under a generous cap, an
out-of-memory error the script catches is still out of memory, a script that ends before its steps is an
error, and the harness never imports autobatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.as_is_process import (
    HarnessError,
    fits_as_is,
    largest_fitting_as_is,
    run_as_is_trial,
    substitute,
)

MiB = 1 << 20
#: A plain loop: a batch of n samples holds n x width floats (1 MiB per sample at the default width);
#: ``--catch`` retries a batch that ran out of memory at half its size, as a script's own finder would.
TINY = """
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
parser.add_argument("--width", type=int, default=262144)
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--catch", action="store_true")
args = parser.parse_args()

model = nn.Linear(args.width, 1)
optimizer = torch.optim.AdamW(model.parameters())
batch = args.batch_size
for _ in range(args.steps):
    try:
        inputs = torch.randn(batch, args.width)
    except RuntimeError:
        if not args.catch:
            raise
        batch //= 2
        continue
    loss = model(inputs).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return path


def test_the_batch_placeholder_is_replaced_and_required(tiny: Path) -> None:
    assert substitute(["--batch-size", "{batch}", "--bs={batch}"], 12) == ["--batch-size", "12", "--bs=12"]
    with pytest.raises(ValueError, match="no {batch}"):
        largest_fitting_as_is(tiny, ["--batch-size", "8"], 4096 * MiB, 1, 8)


@pytest.mark.slow
def test_fits_small_and_a_caught_oom_is_still_oom(tiny: Path) -> None:
    generous = run_as_is_trial(tiny, ["--batch-size", "4"], 4096 * MiB, steps=3)
    assert (generous.kind, generous.steps) == ("fits", 3), generous.detail
    assert generous.baseline_bytes is not None and generous.baseline_bytes > 100 * MiB  # torch is imported
    assert generous.vm_data_end is not None
    tight = generous.vm_data_end + 64 * MiB  # 256 MiB of batch alone does not fit
    assert not fits_as_is(tiny, ["--batch-size", "256"], tight, steps=3)
    caught = run_as_is_trial(tiny, ["--batch-size", "256", "--catch"], tight, steps=3)
    assert (caught.kind, caught.steps) == ("oom", 0)  # the script would have gone on at 128, 64, ...
    assert "allocate" in caught.detail


@pytest.mark.slow
def test_a_script_that_ends_before_its_steps_is_an_error(tiny: Path) -> None:
    with pytest.raises(HarnessError, match="the script ended after 2 optimizer step"):
        fits_as_is(tiny, ["--batch-size", "2", "--width", "8", "--steps", "2"], 4096 * MiB, steps=5)
