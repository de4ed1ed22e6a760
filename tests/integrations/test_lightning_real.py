"""``tune --lightning`` and the ``AutoBatch`` callback on the real probe server (slow)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from support import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.consumers]
if importlib.util.find_spec("lightning") is None:  # found, not imported: collection stays quick
    pytest.skip("lightning is not installed", allow_module_level=True)

HERE = Path(__file__).resolve().parent
APP = HERE / "lit_app.py"
#: 64-wide vectors, 256 per sample: about 0.6 MiB of activations per sample under a 520 MiB cap, of whose
#: 468 MiB budget Lightning's imports hold about 395 MiB (at 450 MiB one CI run's maximum was 7).
CONFIG = "model:\n  width: 64\ndata:\n  width: 64\n  tokens: 256\n  samples: 512\n"
QUICK = ("--device", "cpu", "--memory", "520MiB", "-p", "32", "-o", "adamw", "--no-recompute",
         "--confirm-steps", "5")  # fmt: skip


def test_tune_lightning_finds_an_exact_maximum(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    proc = run_cli(
        "tune", "--lightning", f"{APP}:LitMLP", "--datamodule", f"{APP}:LitData",
        "--lightning-config", str(tmp_path / "config.yaml"), *QUICK, "--json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    (combo,) = result["combinations"]
    top = combo["max_batch_size"]
    assert combo["status"] == "exact" and 8 < top < 512, combo
    probed = {p["batch_size"]: p["kind"] for p in combo["trace"]}
    assert probed[top] == "fits" and probed.get(top + 1) == "oom", probed  # both sides of the boundary
    assert result["script"] == f"lightning:{APP}:LitMLP"

    from autobatch.records.schema import result_problems

    assert result_problems(result) == []  # a real result matches the published schema


def test_callback_trains_with_the_tuned_batch_size(tmp_path: Path) -> None:
    from lightning.pytorch import Trainer
    from lit_app import LitData, LitMLP

    from autobatch.integrations.lightning import AutoBatch

    events: list[object] = []
    callback = AutoBatch(
        memory="520MiB", confirm_steps=5, max_batch_size=24, global_batch_size=120, on_probe=events.append
    )  # the search capped at 24 (the maximum is larger; the exact search is the test above's): a short tune
    model, data = LitMLP(width=64), LitData(width=64, tokens=256, samples=512)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(model, datamodule=data)

    result = callback.result
    assert result is not None and result.chosen is not None
    (combo,) = result.combinations  # the Trainer's precision and optimizer, no recomputation
    assert (combo.precision, combo.optimizer, combo.recompute, combo.status) == (
        "32-true",
        "adamw",
        False,
        "capped",
    )
    chosen = result.chosen
    assert chosen.micro_batch_size * chosen.accumulation_steps == 120
    assert data.batch_size == data.hparams.batch_size == chosen.micro_batch_size
    assert trainer.accumulate_grad_batches == chosen.accumulation_steps
    # two optimizer steps of `accumulation` batches each, every one at the tuned micro-batch
    assert model.seen == [chosen.micro_batch_size] * (2 * chosen.accumulation_steps)
    assert events and all(e.combination == "32-true/adamw/no-recompute" for e in events)


def test_callback_with_the_guard_keeps_the_global_batch_through_an_out_of_memory_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch import Trainer
    from lit_app import LitData, LitMLP

    from autobatch.integrations.lightning import AutoBatch

    monkeypatch.setenv("AUTOBATCH_GUARD_FAIL_AT", "1")  # the guard's test hook: a real allocator failure
    callback = AutoBatch(
        memory="520MiB", confirm_steps=5, max_batch_size=16, global_batch_size=48, guard=True
    )  # the search capped at 16 (the maximum is larger): a short tune
    model, data = LitMLP(width=64), LitData(width=64, tokens=256, samples=512)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(model, datamodule=data)

    chosen = callback.result.chosen if callback.result is not None else None
    guard = callback.guard
    assert chosen is not None and guard is not None
    assert data.batch_size == 48 and trainer.accumulate_grad_batches == 1  # the guard owns the split
    assert guard.summary.steps == 3 and guard.summary.out_of_memory == 1
    (event,) = guard.summary.events
    assert (event.step, event.old, event.reason) == (1, chosen.micro_batch_size, "out of memory")
    assert event.new < chosen.micro_batch_size
    # every optimizer step trained all 48 samples, at the tuned micro-batch and then at the lowered one
    assert sum(model.seen) == 3 * 48
    assert set(model.seen) <= {chosen.micro_batch_size, event.new, 48 % chosen.micro_batch_size or 1,
                               48 % event.new or 1}  # fmt: skip
    assert "training_step" not in vars(model)


def test_callback_searches_no_batch_larger_than_the_data_set(tmp_path: Path) -> None:
    """A data set smaller than the maximum: the search stops at its size, as Lightning's finder does (it went past
    it, and the first batch larger than the data set ended ``fit`` with a ContractError)."""
    from lightning.pytorch import Trainer
    from lit_app import LitData, LitMLP

    from autobatch.integrations.lightning import AutoBatch

    callback = AutoBatch(memory="520MiB", confirm_steps=5)  # the maximum is larger than 20 (the tests above)
    model, data = LitMLP(width=64), LitData(width=64, tokens=256, samples=20)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(model, datamodule=data)

    assert callback.result is not None
    (combo,) = callback.result.combinations
    assert (combo.status, combo.max_batch_size) == ("capped", 20), combo
    assert data.batch_size == 20 and model.seen == [20]


def test_callback_refuses_a_module_that_optimizes_manually_before_any_probe(
    tmp_path: Path, monkeypatch
) -> None:
    """A GAN-like module (``automatic_optimization = False``) with the callback: ``fit`` ends at once with a
    ContractError that points to the script run as it is, before any probe server starts (the refusal came from
    inside a probe, after its imports: 78 s on a loaded machine)."""
    from lightning.pytorch import Trainer
    from lit_app import LitData, LitMLP

    from autobatch.errors import ContractError
    from autobatch.integrations.lightning import AutoBatch
    from autobatch.probe.client import NO_SERVER_ENV

    monkeypatch.setenv(NO_SERVER_ENV, "the refusal must come before any probe server")

    class Manual(LitMLP):
        def __init__(self) -> None:
            super().__init__(width=16)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            optimizer = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[AutoBatch(memory="520MiB")],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    with pytest.raises(ContractError, match="uses manual optimization") as raised:
        trainer.fit(Manual(), datamodule=LitData(width=16, tokens=16, samples=64))
    assert "autobatch tune train.py -- --batch-size {batch}" in (raised.value.hint or "")
