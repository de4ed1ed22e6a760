"""Activation recomputation: wrap the model's repeated blocks in non-reentrant checkpointing.

Finds the blocks (the classes the user names, else the detected outermost repeated children holding the
most parameters) and applies a level: ``full``, the first ``K`` of ``N`` blocks, or ``selective`` (a per-op
policy that saves :data:`SAVED_OPS`). A malformed level string here is a programming error
(:class:`ValueError`): user input is parsed and named before it reaches the step. How blocks are detected:
docs/script.md ("Recomputation"); the levels, why the first ``K`` and their measured peaks: docs/levers.md.
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autobatch.core.levels import FULL, SELECTIVE, fraction
from autobatch.errors import NoBlocksError
from autobatch.settings.levers import neutral

_HOLDERS = (torch.nn.ModuleList, torch.nn.Sequential)  # whose repeated children may be blocks
_PLAIN_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def detect_blocks(model: torch.nn.Module) -> tuple[str, ...]:
    """The outermost repeated block class holding the most parameters (see the module docstring) as a
    1-tuple; empty when the model has none."""
    repeated = {name for name, count in _held(model.modules()).items() if count >= 2}
    counts: Counter[str] = Counter()
    params: Counter[str] = Counter()
    pending = deque([model])
    while pending:  # top-down, never inside an instance of a repeated class
        module = pending.popleft()
        for child in module.children():
            name = type(child).__name__
            held = sum(p.numel() for p in child.parameters()) if isinstance(module, _HOLDERS) else 0
            if name not in repeated:
                pending.append(child)
            elif held:
                counts[name] += 1
                params[name] += held
    blocks = [name for name in params if counts[name] >= 2]
    if not blocks:
        return ()
    return (max(blocks, key=lambda name: (params[name], counts[name])),)


def _held(holders: Iterable[torch.nn.Module]) -> Counter[str]:
    """How many children of the ``ModuleList`` and ``Sequential`` containers among ``holders`` are of
    each class, counting those that hold parameters (plain containers aside: see the module docstring)."""
    counts: Counter[str] = Counter()
    for holder in holders:
        if isinstance(holder, _HOLDERS):
            counts.update(
                type(child).__name__
                for child in holder.children()
                if type(child) not in _PLAIN_CONTAINERS and any(True for _ in child.parameters())
            )
    return counts


def count_blocks(model: torch.nn.Module, class_names: tuple[str, ...]) -> dict[str, int]:
    """How many modules of each named class the model holds (what :func:`wrap_blocks` would wrap)."""
    counts = Counter(type(m).__name__ for m in model.modules() if type(m).__name__ in class_names)
    return {name: counts[name] for name in class_names if counts[name]}


def wrap_blocks(model: torch.nn.Module, class_names: tuple[str, ...]) -> int:
    """Wrap every module whose class is named in ``class_names``; returns how many were wrapped."""
    return sum(_wrap(module) for module in list(model.modules()) if type(module).__name__ in class_names)


def wrap_recompute(
    model: torch.nn.Module, class_names: tuple[str, ...], level: str = "full"
) -> tuple[str, ...]:
    """Wrap the named block classes (the detected ones when none are named) at ``level`` (see the module
    docstring); returns the classes.

    Raises :class:`~autobatch.errors.NoBlocksError` when there is nothing to wrap, or when a ``K/N`` level's
    ``N`` is not the number of blocks the model holds; :class:`ValueError` for a malformed level.
    """
    split = split_level(level)
    classes = class_names or detect_blocks(model)
    blocks = [m for m in model.modules() if type(m).__name__ in classes] if classes else []
    if not blocks:
        raise NoBlocksError(
            "recomputation asked for, but the model has no repeated blocks to wrap"
            + (f" (no module of class {', '.join(classes)})" if classes else ""),
            hint=f"name the block classes with {neutral('recompute_classes')} or RECOMPUTE_CLASSES, or pass "
            f"{neutral('recompute', 'off')}",
        )
    if split is not None and split[1] != len(blocks):
        raise NoBlocksError(
            f"recomputation level {level} checkpoints {split[0]} of {split[1]} blocks, but the model holds "
            f"{len(blocks)} ({_counted(blocks)})",
            hint=f"give a level of the form K/{len(blocks)}, or name other block classes with "
            f"{neutral('recompute_classes')}",
        )
    context = _selective_context if level == "selective" else None
    for index in level_blocks(level, len(blocks)):
        _wrap(blocks[index], context)
    return classes


def split_level(level: str) -> tuple[int, int] | None:
    """``(K, N)`` of a ``K/N`` level (:func:`autobatch.core.levels.fraction`), ``None`` for ``full`` and
    ``selective``; :class:`ValueError` otherwise (a level the core did not make)."""
    if level in (FULL, SELECTIVE):
        return None
    found = fraction(level)
    if found is None or not 1 <= found[0] < found[1]:
        raise ValueError(f"recomputation level {level!r}: expected full, selective or K/N with 1 <= K < N")
    return found


def level_blocks(level: str, n: int) -> list[int]:
    """The indices (in module order) of the blocks that ``level`` checkpoints, of ``n``: all of them for
    ``full`` and ``selective``, the first ``K`` for ``K/N`` (whose ``N`` must be ``n``: :class:`ValueError`)."""
    split = split_level(level)
    if split is None:
        return list(range(n))
    if split[1] != n:
        raise ValueError(f"recomputation level {level} is for {split[1]} blocks, not {n}")
    return list(range(split[0]))


def _counted(blocks: list[torch.nn.Module]) -> str:
    counts = Counter(type(m).__name__ for m in blocks)
    return ", ".join(f"{name} x {count}" for name, count in counts.items())


def _saved_ops() -> frozenset[Any]:
    """The ATen ops (overload packets) of :data:`SAVED_OPS` this torch has."""
    aten = torch.ops.aten
    return frozenset(getattr(aten, name) for name in SAVED_OPS if hasattr(aten, name))


#: Ops whose outputs a ``selective`` level saves: matmuls (``linear`` and ``matmul`` decompose into ``mm``,
#: ``addmm`` and ``bmm`` before a dispatch mode sees them; listed for a torch where they do not) and fused
#: attention kernels (``_scaled_dot_product_attention_math`` decomposes into ``bmm`` and softmax). Names a
#: torch does not have are skipped.
SAVED_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "linear",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
_SAVED = _saved_ops()


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Save the matmuls' and attentions' outputs, recompute the rest (a module-level function: torch.compile
    guards on the context function as a constant)."""
    if getattr(op, "overloadpacket", op) in _SAVED:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_selective_context = functools.partial(create_selective_checkpoint_contexts, _policy)


def _wrap(module: torch.nn.Module, context: Any = None) -> bool:
    """Checkpoint one block (``context``: a selective policy's context function); False if already wrapped."""
    if getattr(module, "_autobatch_recompute", False):
        return False
    module.forward = _checkpointed(module.forward, context)  # type: ignore[method-assign]
    module._autobatch_recompute = True  # type: ignore[assignment]
    return True


def _checkpointed(forward: Any, context: Any = None) -> Any:
    extra = {} if context is None else {"context_fn": context}

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run
