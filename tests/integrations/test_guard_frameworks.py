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
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.consumers]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "guard"
_counter = itertools.count()


def run_example(name: str, *argv: str) -> tuple[ModuleType, Any]:
    """Import an example from its path with its arguments (it parses them at import); run its main()."""
    spec = importlib.util.spec_from_file_location(f"_guard_example_{name}_{next(_counter)}", EXAMPLES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.argv
    sys.argv = [name, *argv]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = saved
    return module, module.main()


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


def test_lightning_fit_survives_an_out_of_memory_failure_with_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("lightning")
    common = ("--steps", "4", "--batch", "8", "--micro", "4")
    monkeypatch.setenv("AUTOBATCH_GUARD_FAIL_AT", "1")
    example, trained = run_example("lightning_fit.py", *common, "--out", str(tmp_path / "guarded"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(", loss")[0] for line in lines] == [
        "step 0: 8 samples, micro-batch 4, attempts 1",
        "step 1: 8 samples, micro-batch 2, attempts 2",
        "step 2: 8 samples, micro-batch 2, attempts 1",
        "step 3: 8 samples, micro-batch 2, attempts 1",
    ]
    log = events(tmp_path / "guarded" / "events.jsonl")
    assert [(e["step"], e["old"], e["new"]) for e in log[:-1]] == [(1, 4, 2)] and log[-1]["steps"] == 4

    monkeypatch.delenv("AUTOBATCH_GUARD_FAIL_AT")
    run_example("lightning_fit.py", *common, "--reference", "--out", str(tmp_path / "reference"))
    assert_same_parameters(tmp_path / "guarded" / "params.pt", tmp_path / "reference" / "params.pt")

    # after fit the module is its own again; a Trainer that accumulates is refused, naming why
    from lightning.pytorch import Trainer

    from autobatch import Guard
    from autobatch.errors import UsageError
    from autobatch.integrations.lightning import Guarded

    assert "training_step" not in vars(trained) and "backward" not in vars(trained)
    model = example.Classifier()
    trainer = Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[Guarded(Guard(2))], default_root_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(UsageError, match="accumulate_grad_batches is 2, not 1"):
        trainer.fit(model, example.DataLoader(example.DATA, batch_size=4))


def test_an_accelerate_loop_survives_an_out_of_memory_failure_with_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("accelerate")
    common = ("--steps", "4", "--batch", "8", "--micro", "4")
    monkeypatch.setenv("AUTOBATCH_GUARD_FAIL_AT", "1,3")
    run_example("accelerate_loop.py", *common, "--out", str(tmp_path / "guarded"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(", loss")[0] for line in lines] == [
        "step 0: 8 samples, micro-batch 4, attempts 1",
        "step 1: 8 samples, micro-batch 2, attempts 2",
        "step 2: 8 samples, micro-batch 2, attempts 1",
        "step 3: 8 samples, micro-batch 1, attempts 2",
    ]
    log = events(tmp_path / "guarded" / "events.jsonl")
    assert [(e["step"], e["old"], e["new"]) for e in log[:-1]] == [(1, 4, 2), (3, 2, 1)]

    monkeypatch.delenv("AUTOBATCH_GUARD_FAIL_AT")
    example, _ = run_example(
        "accelerate_loop.py", *common, "--reference", "--out", str(tmp_path / "reference")
    )
    assert_same_parameters(tmp_path / "guarded" / "params.pt", tmp_path / "reference" / "params.pt")
    torch.manual_seed(0)
    initial = example.build_model().state_dict()
    assert any(
        not torch.equal(initial[k], v) for k, v in torch.load(tmp_path / "reference" / "params.pt").items()
    )


def test_lightning_gradients_survive_a_zero_grad_in_place(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch import Trainer

    from autobatch import Guard
    from autobatch.integrations.lightning import Guarded

    common = ("--steps", "3", "--batch", "8", "--micro", "4")
    example, _ = run_example("lightning_fit.py", *common, "--reference", "--out", str(tmp_path / "reference"))

    class ZeroingInPlace(example.Classifier):  # type: ignore[name-defined,misc]
        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            optimizer.zero_grad(set_to_none=False)

    torch.manual_seed(0)
    model = ZeroingInPlace()
    trainer = Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                      callbacks=[Guarded(Guard(4, sizes=[1, 2, 4], fail_at=[1]))])  # fmt: skip
    trainer.fit(model, example.DataLoader(example.DATA, batch_size=8))
    torch.save(model.state_dict(), tmp_path / "guarded.pt")
    assert_same_parameters(tmp_path / "guarded.pt", tmp_path / "reference" / "params.pt")
