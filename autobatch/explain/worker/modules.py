"""The per-module table of ``autobatch explain``: parameters, activations and forward FLOPs per module.

:class:`ModuleRecorder` attributes outputs and saved tensors to the innermost module running, and
:func:`add_flops` counts each module's forward FLOPs; every figure of a :class:`ModuleStats` row is the
module's *own* (its children have their own rows), so the rows add up to the model's totals. Work done
outside any module (the loss) is the row ``(outside modules)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from autobatch.explain.worker.tracker import MemoryTracker, nbytes_of

OUTSIDE = "(outside modules)"


@dataclass
class ModuleStats:
    """One row of the table, the module's own figures (its children have their own rows)::

    ``params``, ``param_bytes``   parameters the module registers itself (a tied weight counts once, at
                                  the first module that holds it, in ``named_parameters`` order)
    ``grad_bytes``, ``optimizer_state_bytes``   the gradients and optimizer state of those parameters
    ``output_elements``, ``output_bytes``   what the module's forward returned (every call of one forward)
    ``saved_bytes``   tensors autograd saved for backward while this module was the innermost one running,
                      each storage once, parameters, the batch and autocast's weight copies excluded
    ``attention_bytes``   of ``saved_bytes``, the tensors whose last two dimensions are both the sequence
                      length ``L`` (``explain --seq-len L``): materialised attention scores or probabilities,
                      ``(batch, heads, L, L)``, and masks of ``(L, L)``, the ``L²`` term of the step's memory
    ``flops``         forward floating-point operations of the module's own code, as PyTorch's
                      ``FlopCounterMode`` counts them: 2 per multiply-add for matrix products and
                      convolutions (a Linear M->N on a batch B: 2*B*M*N), element-wise operations not
                      counted; ``macs = flops // 2``
    ``memory_bytes``  param + grad + optimizer state + saved bytes: what the table is sorted by
    """

    name: str  # dotted path; "" for the root
    type: str
    params: int = 0
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_state_bytes: int = 0
    output_elements: int = 0
    output_bytes: int = 0
    saved_bytes: int = 0
    attention_bytes: int = 0
    flops: int = 0
    calls: int = 0

    @property
    def macs(self) -> int:
        return self.flops // 2

    @property
    def memory_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes + self.saved_bytes

    @property
    def label(self) -> str:
        return self.name or f"(root {self.type})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "macs": self.macs, "memory_bytes": self.memory_bytes}


class ModuleRecorder:
    """Forward hooks on every module plus a saved-tensors pack hook, attributing to the innermost module
    (``seq_len``: also single out the saved ``(.., L, L)`` tensors, :func:`is_square_in`)."""

    def __init__(
        self, model: torch.nn.Module, tracker: MemoryTracker | None, seq_len: int | None = None
    ) -> None:
        self.tracker = tracker
        self.seq_len = seq_len
        self.stats: dict[str, ModuleStats] = {}
        self._stack: list[str] = []
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storages counted this forward
        self.active = False
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            self.stats[name] = ModuleStats(name, type(module).__name__)
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name), always_call=True))
        self.stats[OUTSIDE] = ModuleStats(OUTSIDE, "")
        for name, param in model.named_parameters():
            owner = self.stats[name.rpartition(".")[0]]
            owner.params += param.numel()
            owner.param_bytes += param.numel() * param.element_size()

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any) -> None:
            if self.active:
                self._stack.append(name)

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if not self.active:
                return
            if self._stack and self._stack[-1] == name:
                self._stack.pop()
            stats = self.stats[name]
            elements, nbytes = nbytes_of(output)
            stats.output_elements += elements
            stats.output_bytes += nbytes
            stats.calls += 1

        return hook

    def begin_forward(self) -> None:
        """Start a new forward: the figures describe the last forward recorded."""
        for stats in self.stats.values():
            stats.output_elements = stats.output_bytes = stats.saved_bytes = stats.calls = 0
            stats.attention_bytes = 0
        self._seen = WeakIdKeyDictionary()
        self._stack.clear()
        self.active = True

    def end_forward(self) -> None:
        self.active = False
        self._stack.clear()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """The saved-tensors pack hook: attribute the storage to the innermost running module."""
        if not self.active:
            return tensor
        storage = tensor.untyped_storage()
        if storage in self._seen:
            return tensor
        self._seen[storage] = True
        if self.tracker is not None:
            category = self.tracker.category_of(tensor)
            if category in ("parameters", "buffers", "inputs", "autocast_copies"):
                return tensor
            self.tracker.tag([tensor], "activations")
        owner = self.stats[self._stack[-1] if self._stack else OUTSIDE]
        owner.saved_bytes += storage.nbytes()
        if self.seq_len is not None and is_square_in(tensor, self.seq_len):
            owner.attention_bytes += storage.nbytes()
            if self.tracker is not None:
                self.tracker.mark(tensor)
        return tensor

    def add_static(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Gradient and optimizer-state bytes of each module's own parameters (after a step)."""
        for name, param in model.named_parameters():
            owner = self.stats[name.rpartition(".")[0]]
            if param.requires_grad:
                owner.grad_bytes += param.numel() * param.element_size()
            if optimizer is not None and param in optimizer.state:
                owner.optimizer_state_bytes += sum(
                    v.numel() * v.element_size()
                    for v in optimizer.state[param].values()
                    if isinstance(v, torch.Tensor)
                )

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def is_square_in(tensor: torch.Tensor, seq_len: int) -> bool:
    """Whether the tensor's last two dimensions are both ``seq_len``: attention scores or probabilities
    ``(batch, heads, L, L)`` (or ``(batch x heads, L, L)``), and ``(L, L)`` masks. A ``(batch, L, width)``
    activation looks the same when the width is ``L`` (:func:`width_clash` tells)."""
    return tensor.dim() >= 2 and tensor.shape[-1] == seq_len and tensor.shape[-2] == seq_len


def width_clash(model: torch.nn.Module, seq_len: int) -> bool:
    """Whether some parameter's last dimension (a Linear's input width, an embedding's or a norm's width) is
    ``seq_len``: then a ``(batch, L, width)`` activation can be taken for attention scores."""
    return any(param.shape[-1] == seq_len for param in model.parameters() if param.dim() >= 1)


def attention_layers(stats: dict[str, ModuleStats]) -> list[dict[str, Any]]:
    """The modules that saved ``(.., L, L)`` tensors, and how many bytes, in the model's order."""
    return [{"name": s.label, "bytes": s.attention_bytes} for s in stats.values() if s.attention_bytes]


def add_flops(stats: dict[str, ModuleStats], model: torch.nn.Module, run: Callable[[], Any]) -> None:
    """Run ``run()`` (one forward) under ``FlopCounterMode`` and store each module's own FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    root = type(model).__name__
    inclusive: dict[str, int] = {}
    for name in stats:
        if name == OUTSIDE:
            continue
        key = f"{root}.{name}" if name else root
        inclusive[name] = int(counts.get(key, 0))
    children: dict[str, int] = dict.fromkeys(inclusive, 0)
    for name, value in inclusive.items():
        if name:
            children[name.rpartition(".")[0]] += value
    for name, value in inclusive.items():
        stats[name].flops = max(0, value - children[name])
    stats[OUTSIDE].flops = max(0, int(counts.get("Global", 0)) - inclusive.get("", 0))


def table_rows(stats: dict[str, ModuleStats]) -> list[ModuleStats]:
    """Rows with anything to show, most memory first (then FLOPs, then name)."""
    rows = [
        s
        for s in stats.values()
        if s.param_bytes or s.saved_bytes or s.flops or (s.output_bytes and not _is_container(s, stats))
    ]
    return sorted(rows, key=lambda s: (-s.memory_bytes, -s.flops, s.name))


def _is_container(stats: ModuleStats, everything: dict[str, ModuleStats]) -> bool:
    prefix = f"{stats.name}." if stats.name else ""
    return any(name.startswith(prefix) and name != stats.name for name in everything if name != OUTSIDE)
