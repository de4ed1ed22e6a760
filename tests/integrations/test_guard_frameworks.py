"""The guard where people train, through the real libraries: each example under examples/guard/ runs with an
out-of-memory failure injected at a batch by the guard's test hook (``AUTOBATCH_GUARD_FAIL_AT``, a real
allocator failure), finishes with every batch's samples kept, and ends with the parameters of a run without
the guard at a small micro-batch (the framework's own accumulation). SGD: Adam's normalisation would magnify
float32 summation-order differences in near-zero gradients."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.consumers]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "guard"
_counter = itertools.count()


def run_example(name: str, *argv: str) -> ModuleType:
    """Import an example from its path with its arguments (it parses them at import) and run its main()."""
    spec = importlib.util.spec_from_file_location(f"_guard_example_{name}_{next(_counter)}", EXAMPLES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.argv
    sys.argv = [name, *argv]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = saved
    module.main()
    return module


def assert_same_parameters(guarded: Path, reference: Path) -> None:
    """Every tensor within 1e-5 of the reference, relative to the tensor's largest value."""
    got, want = torch.load(guarded), torch.load(reference)
    assert got.keys() == want.keys()
    for key in want:
        scale = float(want[key].abs().max()) or 1.0
        assert float((got[key] - want[key]).abs().max()) / scale <= 1e-5, key


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_hf_trainer_survives_an_out_of_memory_failure_with_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    common = ("--steps", "4", "--batch", "8", "--micro", "4", "--optim", "sgd")
    monkeypatch.setenv("AUTOBATCH_GUARD_FAIL_AT", "1")
    run_example("hf_trainer.py", *common, "--out", str(tmp_path / "guarded"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(", loss")[0] for line in lines] == [
        "step 0: 8 samples, micro-batch 4, attempts 1",
        "step 1: 8 samples, micro-batch 2, attempts 2",
        "step 2: 8 samples, micro-batch 2, attempts 1",
        "step 3: 8 samples, micro-batch 2, attempts 1",
    ]
    log = events(tmp_path / "guarded" / "events.jsonl")
    assert [(e["step"], e["old"], e["new"], e["reason"]) for e in log[:-1]] == [(1, 4, 2, "out of memory")]
    assert log[-1]["event"] == "summary" and log[-1]["steps"] == 4

    monkeypatch.delenv("AUTOBATCH_GUARD_FAIL_AT")
    run_example("hf_trainer.py", *common, "--reference", "--out", str(tmp_path / "reference"))
    assert_same_parameters(tmp_path / "guarded" / "params.pt", tmp_path / "reference" / "params.pt")
