"""Which tensors hold memory at the peak of a training step, by category.

:class:`MemoryTracker` is a ``TorchDispatchMode`` that sees every ATen operation's output in the step
(real or fake tensors), tracks each storage once until it is freed, categorises it (parameters, buffers,
inputs, activations, autocast copies, gradients, optimizer state, temporaries) and keeps the per-category
totals at the high-water mark. How each category is recognised: docs/explain-estimate.md ("How explain
tracks the step").
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from autobatch.explain.pure.records import TENSOR_CATEGORIES
from autobatch.explain.worker.allocators import Allocator, ExactAllocator
from autobatch.explain.worker.kernels import with_workspaces

#: Categories a later discovery may overwrite (a parameter stays a parameter even when saved).
_PROVISIONAL = ("temporaries", "activations")
_CASTS = ("_to_copy", "to", "type_as")


@dataclass(eq=False)
class _Entry:
    nbytes: int
    category: str
    handle: object
    step: int
    phase: str
    seq: int
    ref: Any = None
    marked: bool = False


@dataclass
class PeakSnapshot:
    """The tracked tensors at the high-water mark."""

    tensor_bytes: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    phase: str = ""
    step: int = 0
    seq: int = 0  # storages tracked up to this one were alive at the peak if they are alive now
    marked: int = 0  # bytes of marked storages (MemoryTracker.mark) alive at the peak


class MemoryTracker(TorchDispatchMode):
    """Track every tensor storage of a step; see the module docstring.

    ``fake_scalars``: answer ``.item()`` on fake tensors with 1 (``True`` for booleans) instead of
    failing, so that optimizers that read their step count run under fake tensors.
    """

    def __init__(self, allocator: Allocator | None = None, *, fake_scalars: bool = False) -> None:
        super().__init__()
        self.allocator: Allocator = allocator or ExactAllocator()
        self.fake_scalars = fake_scalars
        self._entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._live: set[_Entry] = set()
        self.live: dict[str, int] = dict.fromkeys(TENSOR_CATEGORIES, 0)
        self.tensor_bytes = 0
        self.marked_bytes = 0  # live bytes of the marked storages
        self.peak = PeakSnapshot(categories=dict(self.live))
        self.step_peaks: list[int] = []
        #: The device's peak (allocator units) in the forward and backward of step 2 on, when the
        #: optimizer state is resident: the batch-dependent phase, apart from the optimizer step's.
        self.rising_peak = 0
        self.phase = "setup"
        self.step = 0
        self._seq = 0
        self._param_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        #: Operator namespaces whose outputs get a category of their own (``explain --strategy fsdp``: the
        #: ``fsdp`` ops' all-gather and reduce-scatter buffers); empty: every new storage is a temporary.
        self.op_categories: dict[str, str] = {}

    # -- the dispatch hook --------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # A DTensor (FSDP2's sharded parameters, gradients, optimizer state): let it desugar into
            # ops on its local shard, which come back here; its own storage has the global size, which
            # no rank holds (torch.distributed._tools.MemTracker does the same).
            return NotImplemented
        if self.fake_scalars and func is torch.ops.aten._local_scalar_dense.default:
            return _fake_scalar(args[0])
        out = with_workspaces(func, args, func(*args, **(kwargs or {})))
        category = self.op_categories.get(getattr(func, "namespace", ""), "temporaries")
        if self.phase == "forward" and _is_param_cast(func, args, self._param_storages):
            category = "autocast_copies"
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.track(tensor, category)
        return out

    # -- bookkeeping -------------------------------------------------------------------------------

    def track(self, tensor: torch.Tensor, category: str) -> None:
        """Start tracking the tensor's storage (a DTensor's: its local shard's; no-op when already tracked)."""
        for storage in storages_of(tensor):
            self._track_storage(storage, category)

    def _track_storage(self, storage: torch.UntypedStorage, category: str) -> None:
        if storage in self._entries:
            return
        nbytes = storage.nbytes()
        self._seq += 1
        entry = _Entry(nbytes, category, self.allocator.alloc(nbytes), self.step, self.phase, self._seq)
        entry.ref = weakref.ref(storage, functools.partial(self._released, entry))
        self._entries[storage] = entry
        self._live.add(entry)
        self.live[category] += nbytes
        self.tensor_bytes += nbytes
        if self.tensor_bytes > self.peak.tensor_bytes:
            self._snapshot(self._seq)
        if self.step_peaks:
            self.step_peaks[-1] = max(self.step_peaks[-1], self.tensor_bytes)
        self._note_rising()

    def _snapshot(self, seq: int) -> None:
        self.peak = PeakSnapshot(
            self.tensor_bytes, dict(self.live), self.phase, self.step, seq, self.marked_bytes
        )

    def _note_rising(self) -> None:
        if self.step >= 2 and self.phase in ("forward", "backward"):
            self.rising_peak = max(self.rising_peak, self.allocator.current)

    def resized(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """A tracked storage was resized in place (FSDP2 frees and refills its unsharded parameters with
        ``UntypedStorage.resize_``, which the dispatcher does not see): count its new size."""
        entry = self._entries.get(storage)
        if entry is None:
            return
        self._released(entry, None)
        if nbytes > 0:
            entry.nbytes, entry.handle = nbytes, self.allocator.alloc(nbytes)
            self._live.add(entry)
            self.live[entry.category] += nbytes
            self.tensor_bytes += nbytes
            if entry.marked:
                self.marked_bytes += nbytes
            if self.tensor_bytes > self.peak.tensor_bytes:
                self._snapshot(entry.seq)
            if self.step_peaks:
                self.step_peaks[-1] = max(self.step_peaks[-1], self.tensor_bytes)
            self._note_rising()

    def _released(self, entry: _Entry, _ref: object) -> None:
        if entry not in self._live:
            return
        self._live.discard(entry)
        self.live[entry.category] -= entry.nbytes
        self.tensor_bytes -= entry.nbytes
        if entry.marked:
            self.marked_bytes -= entry.nbytes
        self.allocator.free(entry.handle)

    def tag_storage(self, storage: torch.UntypedStorage, category: str) -> None:
        """Set the category of a tracked provisional storage (no-op when untracked)."""
        entry = self._entries.get(storage)
        if entry is None or entry.category == category or entry.category not in _PROVISIONAL:
            return
        self.live.setdefault(category, 0)
        self.peak.categories.setdefault(category, 0)
        if entry in self._live:
            self._move(entry, category)
        else:  # resized to nothing: counted in its category when it is refilled
            entry.category = category

    def tag(self, tensors: Iterable[torch.Tensor], category: str, *, only_provisional: bool = True) -> int:
        """Set the category of these tensors' storages (tracking them if new); returns bytes newly tagged."""
        moved = 0
        for storage in (st for tensor in tensors for st in storages_of(tensor)):
            entry = self._entries.get(storage)
            if entry is None:
                self._track_storage(storage, category)
                continue
            if entry.category == category or (only_provisional and entry.category not in _PROVISIONAL):
                continue
            self._move(entry, category)
            moved += entry.nbytes
        return moved

    def mark(self, tensor: torch.Tensor) -> int:
        """Single out these tracked storages (whatever their category): the peak reports how many of their
        bytes were alive at it (``peak.marked``); returns the bytes newly marked."""
        marked = 0
        for storage in storages_of(tensor):
            entry = self._entries.get(storage)
            if entry is None or entry.marked:
                continue
            entry.marked = True
            if entry in self._live:
                marked += entry.nbytes
                self.marked_bytes += entry.nbytes
                if entry.seq <= self.peak.seq:  # alive now and tracked before the peak: alive at it
                    self.peak.marked += entry.nbytes
        return marked

    @property
    def seq(self) -> int:
        """The sequence number of the last storage tracked (for :meth:`tag_since`)."""
        return self._seq

    def tag_since(self, seq: int, category: str) -> int:
        """Move the live provisional storages tracked after ``seq`` to ``category``, which may be one of a
        distributed strategy's own (DDP's gradient buckets, made while the model is wrapped); the bytes moved."""
        self.live.setdefault(category, 0)
        self.peak.categories.setdefault(category, 0)
        moved = 0
        for entry in list(self._live):
            if entry.seq > seq and entry.category in _PROVISIONAL:
                self._move(entry, category)
                moved += entry.nbytes
        return moved

    def _move(self, entry: _Entry, category: str) -> None:
        self.live[entry.category] -= entry.nbytes
        self.live[category] += entry.nbytes
        if entry.seq <= self.peak.seq and entry in self._live:
            self.peak.categories[entry.category] -= entry.nbytes
            self.peak.categories[category] += entry.nbytes
        entry.category = category

    def category_of(self, tensor: torch.Tensor) -> str | None:
        entry = next((self._entries.get(st) for st in storages_of(tensor)), None)
        return entry.category if entry is not None else None

    def register_model(self, model: torch.nn.Module) -> None:
        """Track (and tag) the model's parameters and buffers, tied weights once."""
        params = list(model.parameters())
        self.tag(params, "parameters", only_provisional=False)
        self.tag(list(model.buffers()), "buffers", only_provisional=False)
        for storage in (st for p in params for st in storages_of(p)):
            self._param_storages[storage] = True

    def begin_step(self) -> None:
        self.step += 1
        self.step_peaks.append(self.tensor_bytes)

    def end_forward(self) -> None:
        """Everything the forward created that is still alive is kept for backward."""
        for entry in list(self._live):
            if entry.step == self.step and entry.phase == "forward" and entry.category == "temporaries":
                self._move(entry, "activations")

    def tag_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        tensors = [
            v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
        ]
        self.tag(tensors, "optimizer_state")

    def peak_categories(self) -> dict[str, int]:
        return dict(self.peak.categories)


def storages_of(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages that hold a tensor's memory in this process: its own, or for a traceable wrapper
    subclass (a DTensor) its inner tensors' (a DTensor's local shard), never the wrapper's."""
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor.untyped_storage()]
    names, _context = tensor.__tensor_flatten__()
    inner = (getattr(tensor, name) for name in names)
    return [st for t in inner if isinstance(t, torch.Tensor) for st in storages_of(t)]


def _fake_scalar(tensor: torch.Tensor) -> Any:
    if tensor.dtype == torch.bool:
        return True
    return 1.0 if tensor.is_floating_point() or tensor.is_complex() else 1


def _is_param_cast(func: Any, args: Any, param_storages: WeakIdKeyDictionary) -> bool:
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    if name not in _CASTS or not args or not isinstance(args[0], torch.Tensor):
        return False
    return storage_of(args[0]) in param_storages


def storage_of(tensor: torch.Tensor) -> torch.UntypedStorage:
    """The one storage that holds a plain tensor's or a ``DTensor``'s memory (its local shard's)."""
    return storages_of(tensor)[0]


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of tuples, lists and dicts."""
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def nbytes_of(value: Any) -> tuple[int, int]:
    """(elements, bytes) of every tensor in a nested structure, storages shared counted per tensor."""
    tensors = tensor_leaves(value)
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)
