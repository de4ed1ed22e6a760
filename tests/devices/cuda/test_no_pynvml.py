"""A CUDA tune where nvidia-ml-py is not installed: the missing module, its import error and the fix are said once
in the result's notes (they were said twice: by the note on the CUDA context and by the note on the cache).

torch's CUDA calls are stood in for (no GPU here); the snapshot, the device selection, the budget and the notes are
autobatch's own, and the probes a fake runner's."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

import autobatch
from autobatch.devices.cuda import runtime
from autobatch.testing import FakeRunner, affine

MiB, GiB = 1 << 20, 1 << 30


class CudaFake(FakeRunner):
    """A fake runner whose inspection sees a CUDA device, read by the probe's own snapshot."""

    def _inspection(self) -> dict[str, object]:
        return {**super()._inspection(), "cuda_available": True, "snapshot": runtime.snapshot_dict(0)}


def build_model() -> torch.nn.Module:
    return torch.nn.Linear(4, 4)


def make_batch(batch_size: int) -> torch.Tensor:
    return torch.zeros(batch_size, 4)


def compute_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).sum()


def test_a_missing_pynvml_is_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError: not installed
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=0: (80 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=0: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index=0: SimpleNamespace(uuid="GPU-aaaa", pci_bus_id=None, total_memory=80 * GiB),
    )
    result = autobatch.tune(
        build_model=build_model, make_batch=make_batch, compute_loss=compute_loss, device="cuda",
        precisions=["32-true"], optimizers=["adamw"], recompute=[False], daemon="off",
        runner=CudaFake(affine(GiB, 100 * MiB)),
    )  # fmt: skip
    assert result.chosen is not None
    notes = "\n".join(result.notes)
    assert notes.count("pynvml is not importable") == 1 and notes.count("pip install nvidia-ml-py") == 1, (
        notes
    )
    assert "the CUDA context is estimated: pynvml is not importable" in notes
    assert "result not kept in the cache: NVML cannot identify the GPU (no pynvml)" in notes
