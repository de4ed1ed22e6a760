"""A small model whose rank 1 alone fails, by the first script argument: ``oom`` (allocates far beyond
any cap), ``crash`` (dies by SIGKILL mid-step), ``helper-crash`` (starts a ``multiprocessing`` helper, which
inherits the rank's report pipe, then dies by SIGKILL) or ``error`` (raises); rank 0 goes on into the
collectives and would wait there forever if nobody stopped it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

FAULT = sys.argv[1] if len(sys.argv) > 1 else "oom"


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


def make_batch(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, 64)


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_rank() == 1:
        if FAULT == "oom":
            torch.empty(1 << 40, dtype=torch.uint8).fill_(1)  # 1 TiB: beyond any cap
        elif FAULT == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif FAULT == "helper-crash":
            multiprocessing.Process(target=time.sleep, args=(600,), daemon=True).start()
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            raise ValueError("rank 1 refuses")
    return model(batch).square().mean()
