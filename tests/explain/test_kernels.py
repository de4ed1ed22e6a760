"""What kernels allocate that fake tensors do not show: the oneDNN LSTM workspace."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autobatch.explain.worker.kernels import lstm_workspace_bytes
from autobatch.explain.worker.tracker import MemoryTracker


class Workspaces(TorchDispatchMode):
    """The workspaces the real oneDNN LSTM layers return."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mkldnn_rnn_layer.default:
            self.sizes.append(out[3].numel() * out[3].element_size())
        return out


def lstm_forward(batch: int, steps: int, inputs: int, hidden: int, bf16: bool = False) -> torch.Tensor:
    lstm = torch.nn.LSTM(inputs, hidden, batch_first=True)
    x = torch.randn(batch, steps, inputs, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return lstm(x)[0].float().sum()


@pytest.mark.parametrize(
    ("batch", "steps", "inputs", "hidden", "bf16"),
    [(8, 16, 64, 128, False), (4, 48, 200, 300, False), (16, 32, 96, 256, True)],
)
def test_the_workspace_model_matches_the_real_kernel(
    batch: int, steps: int, inputs: int, hidden: int, bf16: bool
) -> None:
    seen = Workspaces()
    try:
        with seen:
            lstm_forward(batch, steps, inputs, hidden, bf16)
    except (
        RuntimeError
    ) as exc:  # a processor without bf16 instructions (AVX-512 BF16, AMX) has no such kernel
        if bf16 and "primitive descriptor" in str(exc):
            pytest.skip(f"this processor has no oneDNN bf16 LSTM kernel: {exc}")
        raise
    if not seen.sizes:
        pytest.skip("this build does not run nn.LSTM through oneDNN")
    dtype = torch.bfloat16 if bf16 else torch.float32
    assert lstm_workspace_bytes(steps, batch, inputs, hidden, dtype) == pytest.approx(seen.sizes[0], rel=0.1)


def test_a_fake_lstm_step_holds_the_workspace() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        tracker = MemoryTracker()
        with tracker:
            loss = lstm_forward(32, 64, 64, 512)
        held = tracker.tensor_bytes
        del loss
    # The forward keeps the workspace (about 64 MiB here) for backward, beside ~6 MiB of visible outputs.
    assert held >= lstm_workspace_bytes(64, 32, 64, 512, torch.float32)
