"""A training step under fake tensors: its memory, with no real allocation.

:func:`simulate` builds the model and the batch under ``torch._subclasses.fake_tensor.FakeTensorMode``
(tensors with shapes, dtypes and devices but no data), runs two full steps (forward, loss, backward,
``optimizer.step()``, ``zero_grad``: the second step has the optimizer state resident, so it holds the
steady-state peak) and tracks every storage with a :class:`~autobatch.explain.tracker.MemoryTracker`
whose allocator model gives the device's figure: a CPU probe process's data memory, or the CUDA
caching allocator's reserved segments.

What it cannot see, and an estimate therefore does not include:

* memory a kernel allocates internally (oneDNN and MKL buffers on the CPU; cuDNN and cuBLAS workspaces
  on CUDA), and kernel choices that differ between devices: the step runs PyTorch's CPU code paths,
  so on a GPU a different SDPA backend (flash, memory-efficient, math) saves different tensors;
* the CUDA context (a card profile assumes one) and other processes;
* data-dependent work: ``.item()`` answers 1, so a step whose shapes depend on values is not modelled,
  and ``16-mixed`` is simulated as a fixed loss scale (GradScaler's inf checks read values).

On a CUDA target the optimizer is built with ``foreach=True`` where it supports it, as PyTorch does by
default on CUDA (one extra parameter-sized intermediate in ``step()``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..contract import UserScript
from ..errors import ContractError
from ..step.loop import autocast_for
from ..step.optimizers import build_optimizer
from ..step.recompute import detect_blocks, wrap_blocks
from .allocators import make_allocator
from .records import Scenario
from .tracker import MemoryTracker, tensor_leaves
from .transforms import Applied, applied_during_step, apply_to_model, trim_batch

#: Optimizers whose torch.optim class takes ``foreach`` (on CUDA it defaults to True).
FOREACH = ("sgd", "sgd-momentum", "adam", "adamw", "adafactor", "rmsprop", "adagrad")
#: The fixed loss scale a 16-mixed simulation multiplies the loss by (GradScaler's initial scale).
LOSS_SCALE = 65536.0


@dataclass
class SimResult:
    """One simulated batch size (bytes; ``device_peak`` in the target device's units)."""

    batch_size: int
    ok: bool = True
    error: str | None = None
    device_peak: int = 0
    tensor_peak: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    step_peaks: list[int] = field(default_factory=list)
    static: dict[str, int] = field(default_factory=dict)  # parameters, gradients, optimizer_state
    peak_phase: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)  # what the transforms changed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def simulate(
    script: UserScript,
    scenario: Scenario,
    batch_size: int,
    *,
    target: str,
    optimizer_kwargs: dict[str, Any] | None = None,
    recompute_classes: tuple[str, ...] = (),
    steps: int = 2,
) -> SimResult:
    """Run ``steps`` full steps under fake tensors and report the peak (see the module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    result = SimResult(batch_size)
    tracker = MemoryTracker(make_allocator(target), fake_scalars=True)
    applied = Applied()
    try:
        with (
            FakeTensorMode(allow_non_fake_inputs=True),
            tracker,
            applied_during_step(scenario.transforms, applied),
        ):
            result.static = _steps(
                script,
                scenario,
                batch_size,
                tracker,
                applied,
                target,
                optimizer_kwargs,
                recompute_classes,
                steps,
            )
    except ContractError:
        raise
    except Exception as exc:  # noqa: BLE001 - a step that cannot run under fake tensors is reported
        result.ok = False
        result.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
    result.device_peak = tracker.allocator.peak
    result.tensor_peak = tracker.peak.tensor_bytes
    result.categories = tracker.peak_categories()
    result.step_peaks = list(tracker.step_peaks)
    result.peak_phase = f"step {tracker.peak.step} {tracker.peak.phase}"
    result.notes = list(applied.notes)
    result.applied = asdict(applied)
    result.seconds = time.perf_counter() - started
    return result


def _steps(
    script: UserScript,
    scenario: Scenario,
    batch_size: int,
    tracker: MemoryTracker,
    applied: Applied,
    target: str,
    optimizer_kwargs: dict[str, Any] | None,
    recompute_classes: tuple[str, ...],
    steps: int,
) -> dict[str, int]:
    model = script.build_model()
    if not isinstance(model, torch.nn.Module):
        raise ContractError(
            f"build_model() returned {type(model).__name__}, not a torch.nn.Module",
            hint="def build_model() -> torch.nn.Module",
        )
    apply_to_model(model, scenario.transforms, applied)
    if scenario.recompute:
        classes = recompute_classes or script.recompute_classes or detect_blocks(model)
        if not classes or not wrap_blocks(model, classes):
            raise ValueError("recomputation asked for, but the model has no repeated blocks to wrap")
    if scenario.precision == "bf16-true":
        cast_floating(model, torch.bfloat16)
    model.train()
    tracker.register_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(optimizer_kwargs or {})
    if target == "cuda" and scenario.optimizer in FOREACH:
        kwargs.setdefault("foreach", True)
    optimizer = build_optimizer(scenario.optimizer, params, kwargs)

    def on_grad(param: torch.Tensor) -> None:
        if param.grad is not None:
            tracker.tag([param.grad], "gradients")

    handles = [p.register_post_accumulate_grad_hook(on_grad) for p in params]
    batch = script.make_batch(batch_size)
    if applied.vocab:
        batch = trim_batch(batch, applied.vocab[1])
    if scenario.precision == "bf16-true":
        batch = _cast_batch(batch)
    tracker.tag(tensor_leaves(batch), "inputs", only_provisional=False)
    precision = scenario.precision
    try:
        for _ in range(steps):
            tracker.begin_step()
            tracker.phase = "forward"
            with autocast_for(precision, "cpu"):
                loss = script.compute_loss(model, batch)
            tracker.end_forward()
            tracker.phase = "backward"
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ContractError(
                    "compute_loss(model, batch) did not return a scalar tensor",
                    hint="def compute_loss(model, batch) -> torch.Tensor  # a scalar",
                )
            (loss.float() * LOSS_SCALE if precision == "16-mixed" else loss).backward()
            tracker.phase = "optimizer"
            optimizer.step()
            tracker.tag_optimizer_state(optimizer)
            tracker.phase = "idle"
            optimizer.zero_grad(set_to_none=True)
            del loss
    finally:
        for handle in handles:
            handle.remove()
    state = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": sum(p.numel() * p.element_size() for p in params),
        "optimizer_state": sum(v.numel() * v.element_size() for v in state),
    }


def cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating parameters and buffers, keeping tied parameters tied (``model.to`` cannot swap fakes)."""
    done: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_floating_point():
                continue
            if id(param) not in done:
                done[id(param)] = torch.nn.Parameter(
                    param.detach().to(dtype), requires_grad=param.requires_grad
                )
            module._parameters[name] = done[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_floating_point():
                module._buffers[name] = buffer.to(dtype)


def _cast_batch(batch: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(
        lambda t: t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, batch
    )
