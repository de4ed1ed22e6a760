"""Where the peak of one real training step goes: categories that add up to the measured peak.

:class:`Instrument` wraps the script's three functions and hooks the step, so that the probe's own step loop
(:func:`autobatch.step.loop.run_steps`, through the worker) runs unchanged while a
:class:`~autobatch.explain.worker.tracker.MemoryTracker` watches every tensor and a
:class:`~autobatch.explain.worker.modules.ModuleRecorder` attributes them to modules. A simulation
(:mod:`autobatch.explain.worker.simulate`) hooks its fake step with the same class.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from autobatch.explain.pure.records import TENSOR_CATEGORIES, Transforms
from autobatch.explain.worker.modules import (
    ModuleRecorder,
    add_flops,
    attention_layers,
    table_rows,
    width_clash,
)
from autobatch.explain.worker.tracker import MemoryTracker, tensor_leaves
from autobatch.explain.worker.transforms import Applied, apply_to_model, trim_batch
from autobatch.step.contract import UserScript
from autobatch.step.loop import autocast_for


class Instrument:
    """Wraps ``build_model``/``make_batch``/``compute_loss`` and hooks one run's steps.

    ``tracker``: the memory tracker to feed (None: only apply the transforms); ``modules``: also
    attribute outputs, saved tensors and FLOPs to modules (the per-module table); ``seq_len``: the
    length the batches carry, whose ``(.., L, L)`` saved tensors the modules single out (:meth:`attention`).

    The categories of a measured run (bytes, at the peak)::

        peak = baseline + parameters + buffers + gradients + optimizer_state + inputs + activations
               + autocast_copies + temporaries + runtime_overhead + residual

    ``baseline``   the probe process before the model exists. On the CPU: its ``VmData`` (Python, torch,
                   the script, and the torch modules a first optimizer step loads lazily, which a tiny
                   warm-up step loads before the reading). On CUDA: memory reserved before the step.
    ``runtime_overhead``  CUDA only: reserved minus allocated at the peak (the caching allocator's slack).
    ``residual``   what no tracked tensor explains: on the CPU, buffers libraries keep outside PyTorch's
                   allocator (MKL's GEMM buffers, oneDNN's scratchpads), allocator rounding and Python
                   objects; on CUDA, workspaces allocated outside tensors. It is stated, never hidden.
    """

    def __init__(
        self,
        transforms: Transforms,
        tracker: MemoryTracker | None,
        *,
        modules: bool = True,
        seq_len: int | None = None,
    ) -> None:
        self.transforms = transforms
        self.seq_len = seq_len
        self.applied = Applied()
        self.tracker = tracker
        self.record_modules = modules
        self.recorder: ModuleRecorder | None = None
        self.model: torch.nn.Module | None = None
        self.batch: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._compute: Callable[[Any, Any], Any] | None = None
        self._handles: list[Any] = []
        self._vocab: int | None = None
        self._hooked = False

    def wrap(self, script: UserScript) -> UserScript:
        """The script with its three functions wrapped."""
        return replace(
            script,
            build_model=self._wrap_build(script.build_model),
            make_batch=self._wrap_batch(script.make_batch),
            compute_loss=self._wrap_loss(script.compute_loss),
        )

    def _wrap_build(self, build: Callable[[], Any]) -> Callable[[], Any]:
        def build_model() -> Any:
            model = build()
            if isinstance(model, torch.nn.Module):
                apply_to_model(model, self.transforms, self.applied)
                self._vocab = self.applied.vocab[1] if self.applied.vocab else None
                self.model = model
            return model

        return build_model

    def _wrap_batch(self, make: Callable[..., Any]) -> Callable[..., Any]:
        # functools.wraps: the wrapper has make_batch's signature (``__wrapped__``), so that whether it takes
        # a length, and the error when it does not, are the script's own (UserScript.batch)
        @functools.wraps(make)
        def make_batch(batch_size: int, *seq_len: int) -> Any:
            batch = make(batch_size, *seq_len)
            return trim_batch(batch, self._vocab) if self._vocab else batch

        return make_batch

    def _wrap_loss(self, compute: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        self._compute = compute

        def compute_loss(model: Any, batch: Any) -> Any:
            tracker = self.tracker
            if tracker is None:
                return compute(model, batch)
            if not self._hooked:
                self._first_forward(model, batch)
            tracker.begin_step()
            tracker.phase = "forward"
            try:
                return self._forward(compute, model, batch)
            finally:
                tracker.end_forward()
                tracker.phase = "backward"

        return compute_loss

    def _forward(self, compute: Callable[[Any, Any], Any], model: Any, batch: Any) -> Any:
        recorder = self.recorder
        if recorder is None:
            return compute(model, batch)
        recorder.begin_forward()
        try:
            with torch.autograd.graph.saved_tensors_hooks(recorder.pack, _unpack):
                return compute(model, batch)
        finally:
            recorder.end_forward()

    def _first_forward(self, model: torch.nn.Module, batch: Any) -> None:
        """The model is final now (moved, cast, wrapped): register it and hook it."""
        assert self.tracker is not None
        tracker = self.tracker
        self.model, self.batch, self._hooked = model, batch, True
        tracker.register_model(model)
        tracker.tag(tensor_leaves(batch), "inputs", only_provisional=False)
        if self.record_modules:
            self.recorder = ModuleRecorder(model, tracker, self.seq_len)

        def on_grad(param: torch.Tensor) -> None:
            if param.grad is not None:
                tracker.tag([param.grad], "gradients")

        for param in model.parameters():
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(on_grad))

    def __enter__(self) -> Instrument:
        if self.tracker is not None:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            tracker = self.tracker

            def pre(optimizer: torch.optim.Optimizer, *_: Any) -> None:
                self.optimizer = optimizer
                tracker.phase = "optimizer"

            def post(optimizer: torch.optim.Optimizer, *_: Any) -> None:
                tracker.tag_optimizer_state(optimizer)
                tracker.phase = "idle"

            self._handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
            tracker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.recorder is not None:
            self.recorder.remove()

    def count_flops(self, precision: str, device_type: str) -> str | None:
        """Forward FLOPs per module (one forward under no_grad); returns a note when it cannot."""
        if self.recorder is None or self.model is None or self._compute is None:
            return "no forward ran: no FLOPs"
        model, batch, compute = self.model, self.batch, self._compute
        try:

            def run() -> Any:
                with torch.no_grad(), autocast_for(precision, device_type):
                    return compute(model, batch)

            add_flops(self.recorder.stats, model, run)
        except Exception as exc:  # noqa: BLE001 - FLOPs are extra information, never fatal
            return f"FLOPs not counted: {type(exc).__name__}: {exc}"
        return None

    def attention(self) -> dict[str, Any] | None:
        """The saved ``(.., L, L)`` tensors of the last forward (None without a length or a module table):
        ``seq_len``, ``saved_bytes`` (all of them), ``peak_bytes`` (those alive at the peak), ``layers``
        ([{name, bytes}], per module, the innermost one running when each was saved) and ``width_clash``."""
        if self.seq_len is None or self.recorder is None or self.model is None or self.tracker is None:
            return None
        layers = attention_layers(self.recorder.stats)
        return {
            "seq_len": self.seq_len,
            "saved_bytes": sum(layer["bytes"] for layer in layers),
            "peak_bytes": self.tracker.peak.marked,
            "layers": layers,
            "width_clash": width_clash(self.model, self.seq_len),
        }

    def categories(self, baseline: int, peak: int, runtime_overhead: int = 0) -> tuple[dict[str, int], int]:
        """The categories at the peak and the residual (``peak - sum(categories)``)."""
        tracked = self.tracker.peak_categories() if self.tracker else dict.fromkeys(TENSOR_CATEGORIES, 0)
        out = {"baseline": baseline, **tracked, "runtime_overhead": runtime_overhead}
        return out, peak - sum(out.values())

    def modules(self) -> list[dict[str, Any]]:
        if self.recorder is None or self.model is None:
            return []
        self.recorder.add_static(self.model, self.optimizer)
        return [row.to_dict() for row in table_rows(self.recorder.stats)]


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
