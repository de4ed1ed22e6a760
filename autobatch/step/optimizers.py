"""Optimizers by short name, built from ``torch.optim`` with their default settings."""

from __future__ import annotations

from typing import Any

import torch

from autobatch.errors import UsageError


def build_optimizer(name: str, params: Any, kwargs: dict[str, Any] | None = None) -> torch.optim.Optimizer:
    """Build the optimizer called ``name`` over ``params``; ``kwargs`` override the defaults."""
    kwargs = dict(kwargs or {})
    optim = torch.optim
    if name == "sgd":
        return optim.SGD(params, **{"lr": 1e-3, **kwargs})
    if name == "sgd-momentum":
        return optim.SGD(params, **{"lr": 1e-3, "momentum": 0.9, **kwargs})
    if name == "adam":
        return optim.Adam(params, **kwargs)
    if name == "adamw":
        return optim.AdamW(params, **kwargs)
    if name == "adamw-fused":
        return optim.AdamW(params, **{"fused": True, **kwargs})
    if name == "adafactor":
        if not hasattr(optim, "Adafactor"):
            raise UsageError(
                "adafactor needs torch >= 2.5 (torch.optim.Adafactor)", hint="upgrade torch or drop adafactor"
            )
        return optim.Adafactor(params, **kwargs)
    if name == "rmsprop":
        return optim.RMSprop(params, **kwargs)
    if name == "adagrad":
        return optim.Adagrad(params, **kwargs)
    raise UsageError(
        f"unknown optimizer {name!r}",
        hint="use one of sgd, sgd-momentum, adam, adamw, adamw-fused, adafactor, rmsprop, adagrad",
    )


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the optimizer's state tensors (zero before the first ``step()``)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value  # FSDP2: this rank's shard
                total += local.numel() * local.element_size()
    return total
