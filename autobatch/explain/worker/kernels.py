"""Memory that kernels allocate and fake tensors do not show, modelled where it was measured.

Under ``FakeTensorMode`` an operator's outputs come from its meta function, which knows shapes, not what a
real kernel keeps. Where the difference is large and predictable it is modelled here, and the simulated
step gets a fake tensor of the real size in its place: today the oneDNN LSTM workspace
(``aten::mkldnn_rnn_layer``, fitted to measurements: docs/measurements/in-the-code.md). A kernel that already
reports its workspace (a real run) is left alone.
"""

from __future__ import annotations

from typing import Any

import torch

#: Bytes per sample of the oneDNN LSTM workspace: (per time step and hidden feature, per time step + 1
#: and state feature, constant), by input dtype.
LSTM_WORKSPACE = {
    torch.float32: (34.5, 25.9, 11020.0),
    torch.bfloat16: (20.5, 22.1, 7545.0),
}


def lstm_workspace_bytes(steps: int, batch: int, inputs: int, hidden: int, dtype: torch.dtype) -> int:
    """The oneDNN LSTM layer's training workspace (see the module docstring)."""
    a, c, e = LSTM_WORKSPACE.get(dtype, LSTM_WORKSPACE[torch.float32])
    return int(batch * (a * steps * hidden + c * (steps + 1) * max(inputs, hidden) + e))


def with_workspaces(func: Any, args: Any, out: Any) -> Any:
    """``out``, with the workspace a real kernel would have allocated in place of an empty one."""
    if func is not torch.ops.aten.mkldnn_rnn_layer.default:
        return out
    output, hy, cy, workspace = out
    x, hidden, batch_first, train = args[0], args[10], args[14], args[15]
    if not train or workspace.numel() > 0 or x.dim() != 3:
        return out
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    nbytes = lstm_workspace_bytes(int(steps), int(batch), int(x.shape[-1]), int(hidden), x.dtype)
    return (output, hy, cy, torch.empty(nbytes, dtype=torch.uint8, device=workspace.device))
