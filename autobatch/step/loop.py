"""Full training steps under a precision: forward, loss, backward, ``optimizer.step()``, ``zero_grad``.

Precisions (Lightning's names): ``32-true`` plain fp32; ``bf16-mixed`` autocast to bfloat16 with fp32
parameters; ``16-mixed`` autocast to float16 with a GradScaler; ``bf16-true`` the model and the
floating-point inputs cast to bfloat16.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import ContractError
from .optimizers import build_optimizer, optimizer_state_bytes
from .recompute import detect_blocks, wrap_blocks


@dataclass
class StepReport:
    """What the loop measured."""

    steps: int = 0
    step_peaks: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_state_bytes: int = 0
    param_count: int = 0
    recompute_blocks: tuple[str, ...] = ()


def move(batch: Any, device: torch.device, float_dtype: torch.dtype | None = None) -> Any:
    """Move a nested structure of tensors to ``device`` (casting floating tensors if asked)."""
    if isinstance(batch, torch.Tensor):
        out = batch.to(device)
        if float_dtype is not None and out.is_floating_point():
            out = out.to(float_dtype)
        return out
    if isinstance(batch, dict):
        return {k: move(v, device, float_dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [move(v, device, float_dtype) for v in batch]
        return type(batch)(items) if isinstance(batch, list) else tuple(items)
    return batch


def _check_batch(batch: Any, batch_size: int) -> None:
    leaves: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            leaves.append(x)

    walk(batch)
    if not leaves or not any(isinstance(x, torch.Tensor) for x in leaves):
        raise ContractError(
            f"make_batch({batch_size}) returned {type(batch).__name__} with no tensors",
            hint="make_batch(batch_size) must return tensors or nested tuples/lists/dicts of tensors",
        )


@contextlib.contextmanager
def autocast_for(precision: str, device_type: str) -> Iterator[None]:
    if precision == "bf16-mixed":
        with torch.autocast(device_type, dtype=torch.bfloat16):
            yield
    elif precision == "16-mixed":
        with torch.autocast(device_type, dtype=torch.float16):
            yield
    else:
        yield


def run_steps(
    *,
    build_model: Callable[[], Any],
    make_batch: Callable[[int], Any],
    compute_loss: Callable[[Any, Any], Any],
    batch_size: int,
    precision: str,
    optimizer: str,
    optimizer_kwargs: dict[str, Any] | None,
    recompute: bool,
    recompute_classes: tuple[str, ...],
    device: torch.device,
    min_steps: int,
    max_steps: int,
    peak_now: Callable[[], int],
    synchronize: Callable[[], None],
    grow_tolerance: int,
    report: StepReport,
) -> StepReport:
    """Build, then step until the peak stops growing (at least ``min_steps``, at most ``max_steps``).

    ``report`` is filled in as the loop goes, so a caller that catches an OOM still sees how far it got.
    """
    model = build_model()
    if not isinstance(model, torch.nn.Module):
        raise ContractError(
            f"build_model() returned {type(model).__name__}, not a torch.nn.Module",
            hint="def build_model() -> torch.nn.Module",
        )
    if recompute:
        classes = recompute_classes or detect_blocks(model)
        if not classes or not wrap_blocks(model, classes):
            raise ContractError(
                "recomputation asked for, but the model has no repeated blocks to wrap"
                + (f" (no module of class {', '.join(classes)})" if classes else ""),
                hint="name the block classes with --recompute-class or RECOMPUTE_CLASSES, or pass --no-recompute",
            )
        report.recompute_blocks = classes
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    model = model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    report.param_count = sum(p.numel() for p in params)
    report.param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = build_optimizer(optimizer, params, optimizer_kwargs)
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None

    batch = make_batch(batch_size)
    _check_batch(batch, batch_size)
    batch = move(batch, device, torch.bfloat16 if precision == "bf16-true" else None)

    for step in range(1, max_steps + 1):
        synchronize()
        start = time.perf_counter()
        with autocast_for(precision, device.type):
            loss = compute_loss(model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            what = (
                type(loss).__name__
                if not isinstance(loss, torch.Tensor)
                else f"a tensor of shape {tuple(loss.shape)}"
            )
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                what = "a scalar that does not require grad (is the model used?)"
            raise ContractError(
                f"compute_loss(model, batch) returned {what}",
                hint="def compute_loss(model, batch) -> torch.Tensor  # a scalar connected to the model's parameters",
            )
        if scaler is not None:
            scaler.scale(loss.float()).backward()
        else:
            loss.backward()
        if step == 1:
            report.grad_bytes = sum(
                p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None
            )
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        synchronize()
        report.step_seconds.append(time.perf_counter() - start)
        report.step_peaks.append(peak_now())
        report.steps = step
        if step >= max(min_steps, 2) and report.step_peaks[-1] - report.step_peaks[-2] <= grow_tolerance:
            break
    report.optimizer_state_bytes = optimizer_state_bytes(opt)
    return report
