"""Full training steps under a precision: forward, loss, backward, ``optimizer.step()``, ``zero_grad``.

Precisions (Lightning's names): ``32-true`` plain fp32; ``bf16-mixed`` autocast to bfloat16 with fp32
parameters; ``16-mixed`` autocast to float16 with a GradScaler; ``bf16-true`` the model and the
floating-point inputs cast to bfloat16.

The step is written once, in two pieces that a real probe (:func:`run_steps`) and explain's fake-tensor
simulation both call: :func:`build_step` (model, optimizer, batch) and :func:`one_step`. A step built
with ``fake=True`` differs only where fake tensors force it to: the model is not moved (``Module.to``
cannot swap fake parameters), ``bf16-true`` casts with :func:`cast_floating`, and ``16-mixed`` scales
the loss by a fixed factor (:class:`FixedScale`: GradScaler's inf checks read values).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from autobatch.core.step_peaks import StepRule
from autobatch.records.protocol import StepConfig
from autobatch.step.compiling import CompileClock, compile_model, mark_batch_dynamic
from autobatch.step.contract import UserScript, check_batch, check_finite_loss, check_loss, check_model
from autobatch.step.optimizers import build_optimizer, optimizer_state_bytes
from autobatch.step.recompute import wrap_recompute

#: The loss scale a fake ``16-mixed`` step multiplies the loss by (GradScaler's initial scale).
LOSS_SCALE = 65536.0


@dataclass
class StepReport:
    """What the loop measured."""

    steps: int = 0
    step_peaks: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    #: Per step, the seconds of its update (the optimizer's step, the scaler's, ``zero_grad``), part of
    #: ``step_seconds``: a job that accumulates runs it once per global batch, not once per micro-batch.
    update_seconds: list[float] = field(default_factory=list)
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_state_bytes: int = 0
    param_count: int = 0
    recompute_blocks: tuple[str, ...] = ()
    #: The peak when the first backward ended, before any optimizer state existed: the forward and
    #: backward phase alone (a high-water mark reads nothing of a later phase until it is higher).
    first_backward_peak: int | None = None
    #: The loop stopped before ``max_steps`` because the peak crossed the caller's ``stop_above`` line.
    stopped_above: bool = False
    #: With a batch per step: the distinct shapes of the batches, in order, when there was more than one.
    batch_shapes: list[str] = field(default_factory=list)
    #: With ``compile``: the seconds spent compiling (importing the compiler and wrapping the model, then
    #: Dynamo's compilations at the first step and at any recompilation); ``step_seconds`` leave them out.
    #: None: not compiled.
    compile_seconds: float | None = None


class FixedScale:
    """``16-mixed`` under fake tensors: GradScaler's scaling at its initial scale, without its inf checks
    (they read values; a fake ``.item()`` would report an inf and skip every optimizer step)."""

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * LOSS_SCALE

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def update(self) -> None:
        pass


@dataclass
class Step:
    """A built step, ready for :func:`one_step`."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    batch: Any
    compute_loss: Callable[[Any, Any], Any]
    precision: str
    device_type: str
    scaler: torch.amp.GradScaler | FixedScale | None = None
    grad_bytes: int = 0  # the gradients after the last backward
    loss_checked: bool = False  # the first loss was checked to be finite


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


#: Wraps the built model for a distributed strategy (DDP, FSDP2) before the optimizer sees its parameters.
Wrap = Callable[[torch.nn.Module], torch.nn.Module]


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this process holds of a tensor: a DTensor's local shard (FSDP2), else the whole tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def build_step(
    script: UserScript,
    config: StepConfig,
    report: StepReport,
    *,
    fake: bool = False,
    wrap: Wrap | None = None,
) -> Step:
    """Build the model (recomputation, precision, device, ``wrap``, then ``torch.compile``), the optimizer
    and the batch.

    ``report`` gets the parameters and the recomputed blocks; ``fake``: see the module docstring (a fake
    step is never compiled); ``wrap``: a distributed strategy's wrapper (:mod:`autobatch.step.wrapping`).
    """
    device = torch.device(config.device)
    model = check_model(script.build_model())
    if config.recompute:
        classes = config.recompute_classes or script.recompute_classes
        report.recompute_blocks = wrap_recompute(model, classes, config.level)
    bf16_true = config.precision == "bf16-true"
    if fake and bf16_true:
        cast_floating(model, torch.bfloat16)
    elif not fake:
        model = (model.to(torch.bfloat16) if bf16_true else model).to(device)
    model.train()
    if wrap is not None:
        model = wrap(model)
    if config.compile and not fake:
        started = time.perf_counter()
        model = compile_model(model)  # imports Dynamo and inductor: part of the compile's cost
        report.compile_seconds = time.perf_counter() - started
    params = [p for p in model.parameters() if p.requires_grad]
    report.param_count = sum(p.numel() for p in params)
    report.param_bytes = sum(local_bytes(p) for p in model.parameters())
    optimizer = build_optimizer(config.optimizer, params, config.optimizer_kwargs)
    scaler: torch.amp.GradScaler | FixedScale | None = None
    if config.precision == "16-mixed":
        scaler = FixedScale() if fake else torch.amp.GradScaler(device.type)
    batch = draw_batch(script, config, compiling=config.compile and not fake)
    return Step(model, params, optimizer, batch, script.compute_loss, config.precision, device.type, scaler)


def draw_batch(script: UserScript, config: StepConfig, *, compiling: bool = False) -> Any:
    """``make_batch`` at the config's batch size, checked and moved to the device (cast for ``bf16-true``);
    ``compiling``: its tensors' first dimension marked dynamic (:func:`~autobatch.step.compiling.mark_batch_dynamic`)."""
    batch = script.batch(config.batch_size, config.seq_len)
    check_batch(batch, config.batch_size, check_size=config.check_batch_size, seq_len=config.seq_len)
    moved = move(
        batch, torch.device(config.device), torch.bfloat16 if config.precision == "bf16-true" else None
    )
    if compiling:
        mark_batch_dynamic(moved)
    return moved


def shapes_of(batch: Any) -> str:
    """The shapes of a batch's tensors, in order: ``(8, 128) (8, 128)``."""
    if isinstance(batch, torch.Tensor):
        return str(tuple(batch.shape))
    if isinstance(batch, dict):
        return " ".join(filter(None, (shapes_of(v) for v in batch.values())))
    if isinstance(batch, (list, tuple)):
        return " ".join(filter(None, (shapes_of(v) for v in batch)))
    return ""


def one_step(
    step: Step,
    after_backward: Callable[[], None] | None = None,
    before_update: Callable[[], None] | None = None,
) -> None:
    """Forward and loss under the precision's autocast, backward (scaled for ``16-mixed``),
    ``optimizer.step()``, ``zero_grad(set_to_none=True)``; ``after_backward`` runs between the
    backward and the optimizer step, then ``before_update`` (which starts the update's clock)."""
    with autocast_for(step.precision, step.device_type):
        loss = step.compute_loss(step.model, step.batch)
    loss = check_loss(loss)
    if not step.loss_checked:
        check_finite_loss(loss)
        step.loss_checked = True
    scaler = step.scaler
    (scaler.scale(loss.float()) if scaler is not None else loss).backward()
    step.grad_bytes = sum(local_bytes(p.grad) for p in step.params if p.grad is not None)
    if after_backward is not None:
        after_backward()
    if before_update is not None:
        before_update()
    if scaler is not None:
        scaler.step(step.optimizer)
        scaler.update()
    else:
        step.optimizer.step()
    step.optimizer.zero_grad(set_to_none=True)


def run_steps(
    script: UserScript,
    config: StepConfig,
    report: StepReport,
    rule: StepRule,
    *,
    peak_now: Callable[[], int],
    synchronize: Callable[[], None],
    wrap: Wrap | None = None,
    batch_per_step: bool = False,
) -> StepReport:
    """Build, then step until ``rule`` says enough (:class:`~autobatch.core.step_peaks.StepRule`: the peak stops
    growing after its least steps, its most steps, or a peak above its ``stop_above`` line).

    ``report`` is filled in as the loop goes, so a caller that catches an OOM still sees how far it got.
    A peak above ``rule.stop_above`` settles the caller's question (a high-water mark only rises), so the
    loop stops at the step that crossed it (``report.stopped_above``). ``batch_per_step``: every step
    gets a fresh ``make_batch``, as the job's steps do (the previous batch dropped first, and the drawing
    left out of the step's time); the distinct shapes go to ``report.batch_shapes`` when they differ.
    """
    step = build_step(script, config, report, wrap=wrap)
    shapes = [shapes_of(step.batch)]

    def first_backward() -> None:
        synchronize()
        report.first_backward_peak = peak_now()

    with _timing_compiles(config, report) as clock:
        for index in range(1, rule.max_steps + 1):
            if batch_per_step and index > 1:
                step.batch = None  # never two batches at once
                step.batch = draw_batch(script, config, compiling=config.compile)
                _note_shapes(shapes, shapes_of(step.batch), report)
            seconds, update = _timed(step, first_backward if index == 1 else None, synchronize, clock)
            report.step_seconds.append(seconds)
            report.update_seconds.append(update)
            if index == 1:
                report.grad_bytes = step.grad_bytes
            report.step_peaks.append(peak_now())
            report.steps = index
            why = _agreed(rule.why_stop(report.step_peaks))
            if why is not None:
                report.stopped_above = why == "above"
                break
    report.optimizer_state_bytes = optimizer_state_bytes(step.optimizer)
    return report


def _agreed(why: str | None) -> str | None:
    """On ranks, one answer for all: a rank stops only at the step after which every rank would. Each rank reads
    its own peak, and one whose peak settled a step before its peers' would stop alone and leave them waiting in
    the next step's first collective until the probe's timeout."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return why
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    stop = torch.tensor([0 if why is None else 1], device=device)
    dist.all_reduce(stop, op=dist.ReduceOp.MIN)
    return why if int(stop.item()) else None


def _timed(
    step: Step,
    after_backward: Callable[[], None] | None,
    synchronize: Callable[[], None],
    clock: CompileClock | None,
) -> tuple[float, float]:
    """One step's seconds, less the compiling done inside it (``clock``), and its update's seconds (from the
    backward's end to ``zero_grad``'s)."""
    synchronize()
    compiled = clock.seconds if clock is not None else 0.0
    marks: list[float] = []

    def before_update() -> None:
        synchronize()
        marks.append(time.perf_counter())

    start = time.perf_counter()
    one_step(step, after_backward, before_update)
    synchronize()
    end = time.perf_counter()
    elapsed = end - start - (clock.seconds - compiled if clock is not None else 0.0)
    return elapsed, end - marks[0]


@contextlib.contextmanager
def _timing_compiles(config: StepConfig, report: StepReport) -> Iterator[CompileClock | None]:
    """With ``config.compile``, a :class:`CompileClock` whose total is added to ``report.compile_seconds``
    however the steps end (a compile that fails took time too); without it, None."""
    if not config.compile:
        yield None
        return
    with CompileClock() as clock:
        try:
            yield clock
        finally:
            spent = clock.seconds if clock.available else _first_step_excess(report.step_seconds)
            report.compile_seconds = (report.compile_seconds or 0.0) + spent


def _first_step_excess(seconds: list[float]) -> float:
    """Without Dynamo's callbacks: the first step's time over the median of the later ones (all of it alone)."""
    if not seconds:
        return 0.0
    later = seconds[1:]
    return max(0.0, seconds[0] - (statistics.median(later) if later else 0.0))


def _note_shapes(seen: list[str], shapes: str, report: StepReport) -> None:
    """Keep the distinct batch shapes (a few are enough to show that they differ)."""
    if shapes not in seen and len(seen) < 3:
        seen.append(shapes)
        report.batch_shapes = list(seen)


def tiny_step(precision: str, optimizer: str = "sgd", optimizer_kwargs: dict[str, Any] | None = None) -> None:
    """One full step of a tiny model on the CPU: whether the CPU runs a precision at all, and a warm-up
    that loads what torch imports lazily at a first step (raises whatever the step raises)."""
    tiny = UserScript(
        Path("<tiny step>"),
        ModuleType("tiny_step"),
        lambda: torch.nn.Linear(8, 8),
        lambda batch_size: torch.randn(batch_size, 8),
        lambda model, batch: model(batch).float().sum(),
    )
    config = StepConfig(4, precision, optimizer, optimizer_kwargs=dict(optimizer_kwargs or {}))
    one_step(build_step(tiny, config, StepReport()))
